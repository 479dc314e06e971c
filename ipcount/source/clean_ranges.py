"""Clean-range markers: a counting read task that found no rejects in its offset range leaves one
under its checkpoint, so the dead-letter task for that exact range and batch time reads nothing."""

from __future__ import annotations

import json
import logging
import os
import time
import uuid
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ipcount.checkpoint.offset_log import OffsetLog, local_path
from ipcount.errors import SourceError
from ipcount.source.offsets import OffsetRange, SourceOffset, TopicPartitionKey

__all__ = [
    "MARKER_DIR",
    "future_bound",
    "is_clean",
    "mark_clean",
    "prune_passed",
    "prune_retired",
    "unmark",
]

logger = logging.getLogger(__name__)

# Under the counting query's checkpoint: clean-ranges/<topic>/<partition>-<start>-<end>-<future>.
MARKER_DIR = "clean-ranges"
# A temporary file older than this was left by a task that died between write and rename.
_STALE_TMP_S = 600.0


def future_bound(batch_ms: int | None, max_future_skew_ms: int) -> int | None:
    """The event time after which a batch's records are future (None: no bound); part of a
    marker's name, so a range judged by another bound is read again."""
    if max_future_skew_ms > 0 and batch_ms is not None:
        return batch_ms + max_future_skew_ms
    return None


def _root(checkpoint: str) -> Path | None:
    """The marker directory of a local checkpoint; None for other schemes (no markers)."""
    local = local_path(checkpoint.rstrip("/")) if checkpoint else None
    return Path(local) / MARKER_DIR if local else None


def _name(rng: OffsetRange, future_after_ms: int | None) -> str:
    future = "none" if future_after_ms is None else str(future_after_ms)
    return f"{rng.partition}-{rng.start}-{rng.end}-{future}"


def _content(rng: OffsetRange, future_after_ms: int | None) -> dict[str, Any]:
    return {
        "topic": rng.topic,
        "partition": rng.partition,
        "start": rng.start,
        "end": rng.end,
        "futureAfterMs": future_after_ms,
    }


def mark_clean(checkpoint: str, rng: OffsetRange, future_after_ms: int | None) -> None:
    """Record that every record of `rng`, judged with future bound `future_after_ms` (None: no
    bound), counts. Atomic (temporary file, then rename); a failure only costs the dead-letter
    query a read, so it is logged, never raised."""
    root = _root(checkpoint)
    if root is None:
        return
    folder = root / rng.topic
    tmp = folder / f".{_name(rng, future_after_ms)}.{uuid.uuid4().hex[:8]}.tmp"
    try:
        folder.mkdir(parents=True, exist_ok=True)
        tmp.write_text(json.dumps(_content(rng, future_after_ms)), encoding="utf-8")
        os.replace(tmp, folder / _name(rng, future_after_ms))
    except OSError as exc:
        logger.warning("could not write clean-range marker for %s: %s", rng, exc)
        tmp.unlink(missing_ok=True)


def is_clean(checkpoint: str, rng: OffsetRange, future_after_ms: int | None) -> bool:
    """A marker written for exactly this range and future bound exists and reads back whole."""
    root = _root(checkpoint)
    if root is None:
        return False
    path = root / rng.topic / _name(rng, future_after_ms)
    try:
        return bool(json.loads(path.read_text(encoding="utf-8")) == _content(rng, future_after_ms))
    except (OSError, ValueError):
        return False


def unmark(checkpoint: str, rng: OffsetRange, future_after_ms: int | None) -> None:
    """Delete the marker of this range (used up); missing already is fine."""
    root = _root(checkpoint)
    if root is not None:
        try:
            (root / rng.topic / _name(rng, future_after_ms)).unlink(missing_ok=True)
        except OSError as exc:
            logger.warning("could not delete clean-range marker for %s: %s", rng, exc)


def prune_passed(checkpoint: str, below: Mapping[TopicPartitionKey, int]) -> int:
    """Delete the markers of ranges ending at or before `below` (per partition; others kept),
    and stale temporary files. Returns how many markers were deleted."""
    root = _root(checkpoint)
    if root is None or not root.is_dir():
        return 0
    deleted = 0
    now = time.time()
    try:
        paths = [p for folder in root.iterdir() if folder.is_dir() for p in folder.iterdir()]
    except OSError as exc:
        logger.warning("could not list clean-range markers in %s: %s", root, exc)
        return 0
    for path in paths:
        try:
            if path.name.startswith("."):
                if now - path.stat().st_mtime > _STALE_TMP_S:
                    path.unlink(missing_ok=True)
                continue
            partition, _, end, _ = path.name.split("-")
            limit = below.get((path.parent.name, int(partition)))
            if limit is not None and int(end) <= limit:
                path.unlink(missing_ok=True)
                deleted += 1
        except (OSError, ValueError) as exc:
            logger.debug("clean-range marker %s skipped: %s", path, exc)
    return deleted


def prune_retired(checkpoint: str) -> int:
    """Delete the markers of batches Spark has purged from the offset log (minBatchesToRetain):
    once any is purged, ranges ending by the oldest kept entry's end offsets (its own ranges too,
    as its start is no longer known: a dead-letter query that far behind reads them). Returns how
    many were deleted."""
    if _root(checkpoint) is None:
        return 0
    try:
        log = OffsetLog(checkpoint)
        ids = log.batch_ids()
        if not ids or ids[0] == 0:
            return 0
        offsets = log.entry(ids[0])[1]
        if not offsets or offsets[0] is None:
            return 0
        oldest = SourceOffset.from_json(offsets[0]).offsets
    except (OSError, SourceError) as exc:
        logger.warning("clean-range markers not pruned: offset log of %s: %s", checkpoint, exc)
        return 0
    return prune_passed(checkpoint, oldest)
