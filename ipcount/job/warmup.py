"""Pre-started Python workers: while the query starts (preflight, the sink's history check, Spark's
Python planner processes), a tiny Spark job in the background starts the Python worker daemon and
one worker per core, with the read tasks' and the sink's modules imported, so the first
micro-batch's tasks find warm workers (Spark reuses Python workers: spark.python.worker.reuse).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterator
from typing import Any

__all__ = ["warm_python_workers"]

logger = logging.getLogger(__name__)


def _prime(batches: Iterator[Any]) -> Iterator[Any]:
    # Runs in a Python worker: import what the read and write tasks import first.
    import ipcount.sink.writer  # noqa: F401
    import ipcount.source.combined_reader  # noqa: F401
    import ipcount.source.reader  # noqa: F401

    yield from batches


def warm_python_workers(spark: Any) -> threading.Thread:
    """Start the warm-up job in a daemon thread; a failure only logs (the job does not need it)."""

    def work() -> None:
        try:
            n = max(1, int(spark.sparkContext.defaultParallelism))
            spark.range(n, numPartitions=n).mapInArrow(_prime, "id long").collect()
            logger.debug("warmed %d Python workers", n)
        except Exception as exc:  # noqa: BLE001 - an optimisation only
            logger.debug("Python worker warm-up failed: %s", exc)

    thread = threading.Thread(target=work, name="ipcount-warmup", daemon=True)
    thread.start()
    return thread
