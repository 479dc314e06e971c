"""The base of the job's streaming query listeners (driver): progress events reach them as the
progress's JSON, which is all they read."""

from __future__ import annotations

import logging
from typing import Any

from pyspark.sql.streaming import StreamingQueryListener
from pyspark.sql.streaming.listener import (
    QueryIdleEvent,
    QueryStartedEvent,
    QueryTerminatedEvent,
)

__all__ = ["JsonProgress", "JsonProgressEvent", "ProgressListener", "detach_listeners"]

logger = logging.getLogger(__name__)


class JsonProgress:
    """A progress as its JSON: `event.progress.json`, as PySpark's progress has it."""

    __slots__ = ("json",)

    def __init__(self, text: str) -> None:
        self.json = text


class JsonProgressEvent:
    """What a ProgressListener's onQueryProgress receives."""

    __slots__ = ("progress",)

    def __init__(self, text: str) -> None:
        self.progress = JsonProgress(text)


class _JavaListener:
    """The Java side's view of a ProgressListener (py4j implements Spark's interface with it).

    PySpark's own bridge turns each progress event into Python objects field by field, and each
    Java map it iterates ends in a NoSuchElementException that PySpark converts with up to ten
    `is_instance_of` calls, each a class lookup through every jar for names that do not exist:
    ~20% of a core on the listener bus's thread at 20,000 records/s (JFR: half of the JVM's
    samples). Here a progress event is one call for its JSON.
    """

    def __init__(self, listener: StreamingQueryListener) -> None:
        self.listener = listener

    def onQueryStarted(self, jevent: Any) -> None:  # noqa: N802 - Spark's interface
        self.listener.onQueryStarted(QueryStartedEvent.fromJObject(jevent))

    def onQueryProgress(self, jevent: Any) -> None:  # noqa: N802 - Spark's interface
        self.listener.onQueryProgress(JsonProgressEvent(jevent.progress().json()))  # type: ignore[arg-type]

    def onQueryIdle(self, jevent: Any) -> None:  # noqa: N802 - Spark's interface
        self.listener.onQueryIdle(QueryIdleEvent.fromJObject(jevent))

    def onQueryTerminated(self, jevent: Any) -> None:  # noqa: N802 - Spark's interface
        self.listener.onQueryTerminated(QueryTerminatedEvent.fromJObject(jevent))

    class Java:
        implements = ["org.apache.spark.sql.streaming.PythonStreamingQueryListener"]


class ProgressListener(StreamingQueryListener):
    """A streaming query listener whose onQueryProgress gets a JsonProgressEvent (only
    `event.progress.json`); the other events are PySpark's. Register it with
    `spark.streams.addListener` as any listener (classic PySpark, not Spark Connect)."""

    @property
    def _jlistener(self) -> Any:
        from pyspark import SparkContext

        if not hasattr(self, "_jlistenerobj"):
            jvm = SparkContext._jvm
            if jvm is None:
                raise RuntimeError("no SparkContext: start the Spark session first")
            self._jlistenerobj = jvm.PythonStreamingQueryListenerWrapper(_JavaListener(self))
        return self._jlistenerobj


def detach_listeners(
    spark: Any, listeners: list[StreamingQueryListener], timeout_s: float = 10.0
) -> None:
    """Remove `listeners` from `spark`'s streaming queries once Spark's listener bus has delivered
    every event posted so far (a stopped query's QueryTerminatedEvent is posted before `stop()`
    returns, and delivered later, on the bus's thread).

    Removed while an event is on its way, a Python listener is still called with it, and when
    the job's Python process is exiting by then, Spark logs an ERROR with a py4j trace ("Error
    while sending a command"). Waits at most `timeout_s`; a bus that does not drain in time (or
    cannot be asked) is logged at debug and the listeners are removed anyway.
    """
    try:
        spark.sparkContext._jsc.sc().listenerBus().waitUntilEmpty(int(timeout_s * 1000))
    except Exception as exc:  # py4j: a TimeoutException, or no JVM any more
        logger.debug("listener bus not drained before removing the listeners: %s", exc)
    for listener in listeners:
        spark.streams.removeListener(listener)
