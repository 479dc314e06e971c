"""Each sink task writes its share of a micro-batch in its own Kafka
transaction (executor), with its own transactional.id and progress marker; the driver's commit()
then records the batch in the query's marker from what the tasks report."""

from __future__ import annotations

import logging
from dataclasses import dataclass, replace
from typing import Protocol

from pyspark.sql.datasource import WriterCommitMessage

from ipcount.errors import SinkError
from ipcount.sink.producer_config import Record, TxnConfig, task_transactional_id
from ipcount.sink.sessions import session_for

__all__ = ["BATCH_ID_PROPERTY", "TaskCommitReport", "commit_task", "task_config", "written_by"]

logger = logging.getLogger(__name__)

# The local property Spark's micro-batch execution sets on every job of a batch (tasks see it).
BATCH_ID_PROPERTY = "streaming.sql.batchId"


class _TaskContext(Protocol):
    def partitionId(self) -> int: ...  # noqa: N802 - pyspark's name
    def getLocalProperty(self, key: str) -> str | None: ...  # noqa: N802 - pyspark's name


@dataclass
class TaskCommitReport(WriterCommitMessage):
    """What one sink task did with its share: 'committed', 'replay' (its partition had committed
    this batch already: nothing written) or 'empty'; the results its marker counts."""

    partition_id: int
    status: str
    records: int = 0
    late_records: int = 0
    # How long the task's commit took (its transaction, or finding the batch committed).
    seconds: float = 0.0
    # How long the task took to receive and encode its rows (Arrow batches -> Kafka records);
    # the rows come as the stage above computes them (the state store's updates and removals).
    encode_seconds: float = 0.0


def task_config(config: TxnConfig, sink_partition: int) -> TxnConfig:
    """The session config of one sink task: its own transactional.id and marker; no checkpoint
    (the driver's check covers it, and an executor may not reach the driver's disk)."""
    return replace(
        config,
        transactional_id=task_transactional_id(config.transactional_id, sink_partition),
        sink_partition=sink_partition,
        checkpoint="",
    )


def commit_task(
    config: TxnConfig, ctx: _TaskContext, records: list[Record], *, encode_seconds: float = 0.0
) -> TaskCommitReport:
    """Commit this task's records (and its marker) in one transaction of its own; a task whose
    partition committed the batch already writes nothing. Runs on the executor.

    Raises:
        SinkError: the task runs outside a micro-batch (no batch id).
        TransactionAbortedError / FatalKafkaError: as TxnSession.commit_batch.
    """
    raw = ctx.getLocalProperty(BATCH_ID_PROPERTY)
    if raw is None or not raw.lstrip("-").isdigit():
        raise SinkError(
            f"the ipcount-kafka-txn sink needs the micro-batch's id in the task's local property "
            f"{BATCH_ID_PROPERTY!r} (got {raw!r}): this sink writes streaming queries only"
        )
    partition = ctx.partitionId()
    session = session_for(task_config(config, partition))
    outcome = session.commit_batch(int(raw), records)
    marker = session.last_marker
    if outcome.status == "empty" or marker is None or marker.batch_id != outcome.batch_id:
        # Nothing of this batch in the partition's own marker (skipped by the query's marker).
        return TaskCommitReport(
            partition, outcome.status, seconds=outcome.seconds, encode_seconds=encode_seconds
        )
    return TaskCommitReport(
        partition,
        outcome.status,
        marker.records,
        marker.late_records or 0,
        outcome.seconds,
        encode_seconds,
    )


def written_by(batch_id: int, reports: list[WriterCommitMessage | None]) -> tuple[int, int]:
    """The results the batch's sink tasks committed: (to the sink topic, to other topics).
    Runs on the driver, which receives these counts and nothing of the results."""
    done = [r for r in reports if isinstance(r, TaskCommitReport)]
    written = sum(r.records for r in done), sum(r.late_records for r in done)
    if done:
        slowest = max(done, key=lambda r: r.encode_seconds + r.seconds)
        # A batch with nothing to write (most of the dead-letter query's) is not worth a line.
        logger.log(
            logging.INFO if any(written) else logging.DEBUG,
            "batch %d: %d sink task(s) wrote %d records (+%d corrections) in their own "
            "transactions (%s; slowest task: rows and encoding %.3fs, commit %.3fs)",
            batch_id,
            len(done),
            written[0],
            written[1],
            ", ".join(f"{r.partition_id}: {r.status}" for r in sorted(done, key=_partition_id)),
            slowest.encode_seconds,
            slowest.seconds,
            extra={
                "fields": {
                    "batch": batch_id,
                    "tasks": len(done),
                    "records": written[0],
                    "corrections": written[1],
                    "slowest_rows_encode_s": round(slowest.encode_seconds, 3),
                    "slowest_commit_s": round(slowest.seconds, 3),
                }
            },
        )
    return written


def _partition_id(report: TaskCommitReport) -> int:
    return report.partition_id
