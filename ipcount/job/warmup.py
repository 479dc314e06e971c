"""Start Spark's Python workers before the first micro-batch: the read path imported in each, off
the first batch's critical path."""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from pyspark.sql.datasource import DataSource, DataSourceReader, InputPartition

__all__ = ["WarmupDataSource", "warm_python_workers"]

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

logger = logging.getLogger(__name__)


class WarmupDataSource(DataSource):
    """A batch data source whose read tasks import ipcount's read and write paths: Spark runs them
    in the same reused Python workers as the Kafka source's read tasks (a plain RDD job's
    workers are not reused for data source reads)."""

    @classmethod
    def name(cls) -> str:
        return "ipcount-warmup"

    def schema(self) -> str:
        return "pid long"

    def reader(self, schema: Any) -> _WarmupReader:
        return _WarmupReader(int(self.options.get("tasks", "1")))


class _WarmupReader(DataSourceReader):
    def __init__(self, tasks: int) -> None:
        self.tasks = tasks

    def partitions(self) -> list[InputPartition]:
        return [InputPartition(i) for i in range(self.tasks)]

    def read(self, partition: InputPartition) -> Iterator[tuple[int]]:
        import os

        import ipcount.sink.writer  # noqa: F401
        import ipcount.source.counting_task  # noqa: F401
        from ipcount.worker_gc import freeze_long_lived

        freeze_long_lived()
        yield (os.getpid(),)


def warm_python_workers(spark: SparkSession) -> threading.Thread:
    """Run one tiny read task per core in a background thread, so that Spark's Python daemon and
    one reused worker per core exist, with the read and write paths imported, when the first
    batch's tasks arrive (they otherwise pay it). A failure only costs the time it would have
    saved: it is logged at debug."""
    tasks = max(1, spark.sparkContext.defaultParallelism)

    def run() -> None:
        try:
            spark.sparkContext.setJobDescription("ipcount: start Python workers")
            spark.read.format(WarmupDataSource.name()).option("tasks", tasks).load().collect()
        except Exception as exc:  # noqa: BLE001 - an optimisation; the batch starts workers itself
            logger.debug("starting Python workers ahead failed: %s", exc)

    thread = threading.Thread(target=run, name="ipcount-warm-workers", daemon=True)
    thread.start()
    return thread
