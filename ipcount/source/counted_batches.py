"""The counting query's batches as the dead-letter query needs them (driver only): each batch's
start, end and time, and the query's first offsets, kept under its checkpoint until the
dead-letter query has passed them, whatever Spark purges from its offset log."""

from __future__ import annotations

import json
import logging
import os
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ipcount.checkpoint.offset_log import local_path
from ipcount.errors import SourceError
from ipcount.source.offsets import SourceOffset, TopicPartitionKey

__all__ = [
    "BATCHES_DIR",
    "CountedBatch",
    "counted_batches",
    "first_offsets",
    "keep_first_offsets",
    "prune_counted",
    "record_batch",
]

logger = logging.getLogger(__name__)

# Under the counting query's checkpoint: counted-batches/<batch id>, and counted-batches/first.
BATCHES_DIR = "counted-batches"
_FIRST = "first"


@dataclass(frozen=True)
class CountedBatch:
    """Counting batch `batch_id` read [start, end) of each partition (a partition missing from
    `start` from 0) and judged its records at `batch_ms` (Spark's batchTimestampMs)."""

    batch_id: int
    start: dict[TopicPartitionKey, int]
    end: dict[TopicPartitionKey, int]
    batch_ms: int

    def encode(self) -> str:
        return json.dumps(
            {
                "batchId": self.batch_id,
                "start": SourceOffset(self.start).to_json()["offsets"],
                "end": SourceOffset(self.end).to_json()["offsets"],
                "batchTimestampMs": self.batch_ms,
            },
            sort_keys=True,
        )

    @classmethod
    def decode(cls, text: str) -> CountedBatch:
        """Raises: ValueError, KeyError, TypeError: not a counted-batch record."""
        obj = json.loads(text)
        return cls(
            int(obj["batchId"]),
            SourceOffset.from_json({"offsets": obj["start"]}).offsets,
            SourceOffset.from_json({"offsets": obj["end"]}).offsets,
            int(obj["batchTimestampMs"]),
        )


def _root(checkpoint: str) -> Path | None:
    """The record directory of a local checkpoint; None for other schemes (nothing kept)."""
    local = local_path(checkpoint.rstrip("/")) if checkpoint else None
    return Path(local) / BATCHES_DIR if local else None


def _write(path: Path, text: str) -> None:
    """Atomic: a temporary file, then rename. Raises OSError."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.parent / f".{path.name}.{uuid.uuid4().hex[:8]}.tmp"
    try:
        tmp.write_text(text, encoding="utf-8")
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def record_batch(checkpoint: str, batch: CountedBatch) -> None:
    """Keep what the dead-letter query needs of one counting batch (a replay writes the same).
    A failure is logged: the dead-letter query then refuses to follow past the gap, and says so."""
    root = _root(checkpoint)
    if root is None:
        return
    try:
        _write(root / str(batch.batch_id), batch.encode())
    except OSError as exc:
        logger.warning("could not keep counting batch %d for dead letters: %s", batch.batch_id, exc)


def counted_batches(checkpoint: str) -> dict[int, CountedBatch]:
    """The kept counting batches by batch id (unreadable records are skipped, logged)."""
    root = _root(checkpoint)
    if root is None or not root.is_dir():
        return {}
    out: dict[int, CountedBatch] = {}
    for path in root.iterdir():
        if not path.name.isdigit():
            continue
        try:
            batch = CountedBatch.decode(path.read_text(encoding="utf-8"))
        except (OSError, ValueError, KeyError, TypeError, SourceError) as exc:
            logger.warning("counted-batch record %s skipped: %s", path, exc)
            continue
        out[batch.batch_id] = batch
    return out


def keep_first_offsets(checkpoint: str, offsets: Mapping[TopicPartitionKey, int]) -> dict[str, Any]:
    """The counting query's first offsets: those kept by an earlier call (a restart before the
    first batch was done must start where that batch starts), else `offsets`, kept now.
    Returns the offset JSON."""
    kept = first_offsets(checkpoint)
    if kept is not None:
        return SourceOffset(kept).to_json()
    root = _root(checkpoint)
    if root is not None:
        try:
            _write(root / _FIRST, json.dumps(SourceOffset(dict(offsets)).to_json()))
        except OSError as exc:
            logger.warning("could not keep the counting query's first offsets: %s", exc)
    return SourceOffset(dict(offsets)).to_json()


def first_offsets(checkpoint: str) -> dict[TopicPartitionKey, int] | None:
    """The counting query's first offsets as kept by `keep_first_offsets`, or None."""
    root = _root(checkpoint)
    if root is None:
        return None
    try:
        text = (root / _FIRST).read_text(encoding="utf-8")
    except OSError:
        return None
    try:
        return SourceOffset.from_json(json.loads(text)).offsets
    except (ValueError, SourceError) as exc:
        logger.warning("first offsets in %s skipped: %s", root, exc)
        return None


def prune_counted(checkpoint: str, below: Mapping[TopicPartitionKey, Any]) -> int:
    """Delete the records of batches ending at or before `below` on every partition (the
    dead-letter query has passed them). Returns how many were deleted."""
    root = _root(checkpoint)
    if root is None:
        return 0
    deleted = 0
    for batch in counted_batches(checkpoint).values():
        if all(end <= below.get(tp, 0) for tp, end in batch.end.items()):
            try:
                (root / str(batch.batch_id)).unlink(missing_ok=True)
                deleted += 1
            except OSError as exc:
                logger.debug("counted-batch record %d not deleted: %s", batch.batch_id, exc)
    return deleted
