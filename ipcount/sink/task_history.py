"""What the sink tasks' own markers (sink.commit_by "tasks") must agree with: a task never skips
a batch older than its partition's newest commit, and the driver never writes a batch over
results the tasks already committed (a switch back to commit_by "driver" mid-batch)."""

from __future__ import annotations

from ipcount.errors import SinkHistoryError
from ipcount.sink.marker import ProgressMarker
from ipcount.sink.producer_config import TxnConfig
from ipcount.sink.runs import ProgressView

__all__ = ["check_no_task_ahead", "older_than_committed"]


def older_than_committed(cfg: TxnConfig, batch_id: int, committed: int) -> SinkHistoryError:
    """The error of a sink task asked to write `batch_id` when its partition (or the query) has
    committed batch `committed` already: the job runs from a checkpoint older than the sink."""
    return SinkHistoryError(
        f"sink task {cfg.sink_partition} of query {cfg.query_id} was asked to write batch "
        f"{batch_id} to {cfg.topic!r}, but batch {committed} of this query is already committed "
        "there: the checkpoint is older than the sink's history. If another process runs this "
        "query on the same checkpoint, stop one of them: this one stops here and writes nothing. "
        "Otherwise restore the checkpoint that committed that batch, or start with `--new-query` "
        "on a new checkpoint"
    )


def check_no_task_ahead(view: ProgressView, cfg: TxnConfig, query: ProgressMarker | None) -> None:
    """A driver-written query (commit_by "driver") must not replay a batch its sink tasks have
    committed part of: the driver would write those partitions' results again.

    Raises:
        SinkHistoryError: a task's marker is newer than the query's marker.
    """
    newest = -1 if query is None else query.batch_id
    ahead = sorted(
        (m.sink_partition, m.batch_id)
        for (query_id, _), m in view.partitions.items()
        if query_id == cfg.query_id and m.batch_id > newest
    )
    if ahead:
        partitions = ", ".join(f"partition {p} at batch {b}" for p, b in ahead)
        raise SinkHistoryError(
            f"query {cfg.query_id}'s sink tasks have committed results the query has not "
            f"recorded yet ({partitions}; the query's last recorded batch is "
            f"{'none' if query is None else newest}): it was running with sink.commit_by = "
            '"tasks". Start it again with sink.commit_by = "tasks" until that batch is done '
            "(one micro-batch), then switch: the driver would write those results again"
        )
