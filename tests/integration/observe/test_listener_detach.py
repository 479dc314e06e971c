"""The job's listeners are removed at its end only once they have handled every event of its
stopped queries: removed while an event is still on its way, a listener is called back into a
Python that may be exiting, and Spark logs an ERROR with a py4j trace ("Error while sending a
command") at a clean stop (seen at the end of a soak)."""

from __future__ import annotations

import threading
import time
from typing import Any

from ipcount.observe.listener import ProgressListener, detach_listeners


class _Slow(ProgressListener):
    """Takes a second over each query's end, as a listener on a loaded driver may."""

    def __init__(self) -> None:
        super().__init__()
        self.started = threading.Event()
        self.handled_end = threading.Event()

    def onQueryStarted(self, event: Any) -> None:  # noqa: N802 - Spark hook
        self.started.set()

    def onQueryProgress(self, event: Any) -> None:  # noqa: N802 - Spark hook
        pass

    def onQueryIdle(self, event: Any) -> None:  # noqa: N802 - Spark hook
        pass

    def onQueryTerminated(self, event: Any) -> None:  # noqa: N802 - Spark hook
        time.sleep(1.0)
        self.handled_end.set()


def test_listeners_are_detached_after_they_have_handled_the_stopped_queries(spark: Any) -> None:
    slow = _Slow()
    spark.streams.addListener(slow)
    query = spark.readStream.format("rate").load().writeStream.format("noop").start()
    try:
        assert slow.started.wait(60), "the query never started"
    finally:
        query.stop()
        detach_listeners(spark, [slow])
    assert slow.handled_end.is_set()
    # Detached: a later query's events no longer reach it.
    slow.started.clear()
    again = spark.readStream.format("rate").load().writeStream.format("noop").start()
    try:
        time.sleep(2)
    finally:
        again.stop()
    assert not slow.started.is_set()
