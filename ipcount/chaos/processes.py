"""What a chaos run reads of its job (in the `ipcount chaos` process): the checkpoint's batch
logs, and the fault specs that arm a job's fault points. The job and generator processes
themselves are ipcount.local_pipeline.children's."""

from __future__ import annotations

import os
from pathlib import Path

__all__ = ["batch_ids", "last_committed_batch", "last_planned_batch", "fault_spec"]


def batch_ids(log_dir: Path) -> list[int]:
    """Batch ids in a Spark metadata log directory (`offsets/` or `commits/`), ascending."""
    try:
        names = os.listdir(log_dir)
    except FileNotFoundError:
        return []
    return sorted(int(n) for n in names if n.isdigit())


def last_committed_batch(checkpoint: str | Path) -> int | None:
    """The last batch in the checkpoint's commit log (Spark writes it after the sink's commit)."""
    ids = batch_ids(Path(checkpoint) / "commits")
    return ids[-1] if ids else None


def last_planned_batch(checkpoint: str | Path) -> int | None:
    """The last batch in the checkpoint's offset log (written before the batch runs)."""
    ids = batch_ids(Path(checkpoint) / "offsets")
    return ids[-1] if ids else None


def fault_spec(point: str, first_batch: int, span: int, action: str = "") -> str:
    """IPCOUNT_FAULTS for `point` at every batch id in [first_batch, first_batch + span).

    Fault points fire only for batches that have output (one in a few triggers has: windows end
    every window_seconds) and are not replays, so a range makes the fault fire at the first
    batch of the range with output instead of never.
    """
    return ",".join(f"{point}@{b}{action}" for b in range(first_batch, first_batch + span))
