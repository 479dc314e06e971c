"""What a sink task's own marker must agree with: a task never skips a batch older than its
partition's (or the query's) newest commit."""

from __future__ import annotations

from ipcount.errors import SinkHistoryError
from ipcount.sink.producer_config import TxnConfig

__all__ = ["older_than_committed"]


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
