"""The dead-letter query follows the counting query's batches (driver only): it reads what that
query has planned, cut at that query's batch ends, and records those batches' times in its own
offsets, so both queries give each record one verdict, through replays too."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from ipcount.source.clean_ranges import future_bound, is_clean
from ipcount.source.offsets import (
    OffsetRange,
    SourceOffset,
    TopicPartitionKey,
    Verdicts,
    follow_batches,
    plan_ranges,
)

__all__ = ["CountsFollower", "plan_followed", "unread_clean"]

# The most batches of the counting query one dead-letter batch follows (its tasks are cut at their
# boundaries, so this bounds the tasks of a dead-letter query catching up).
MAX_FOLLOWED_BATCHES = 16


class CountsFollower:
    """Reads the counting query's offset log (`checkpoint`), each entry once."""

    def __init__(self, checkpoint: str) -> None:
        self.checkpoint = checkpoint
        # batch id -> (end offsets, batch time ms)
        self._batches: dict[int, tuple[dict[TopicPartitionKey, int], int]] = {}

    def follow(
        self, start: dict[TopicPartitionKey, int], end: dict[TopicPartitionKey, int]
    ) -> tuple[dict[TopicPartitionKey, int], Verdicts]:
        """(the end this batch may read up to, the verdicts its records get)."""
        from ipcount.checkpoint.offset_log import OffsetLog

        log = OffsetLog(self.checkpoint)
        ids = log.batch_ids()
        kept = set(ids)
        self._batches = {i: b for i, b in self._batches.items() if i in kept}
        for batch_id in ids:
            if batch_id not in self._batches:
                meta, offsets = log.entry(batch_id)
                ends = SourceOffset.from_json(offsets[0]).offsets if offsets else {}
                self._batches[batch_id] = (ends, int(meta.get("batchTimestampMs", 0)))
        batches = [self._batches[i] for i in ids]
        return follow_batches(start, end, batches, MAX_FOLLOWED_BATCHES)


def plan_followed(
    start: Mapping[TopicPartitionKey, int],
    end: Mapping[TopicPartitionKey, int],
    verdicts: Verdicts,
    min_partitions: int | None,
    max_records_per_partition: int | None,
    min_split_records: int | None = None,
) -> list[tuple[OffsetRange, int | None]]:
    """The dead-letter tasks of one batch, with the batch time that judges each: every followed
    counting batch split as that query split it (plan_ranges over that batch's own start and end),
    so a task reads a range a counting task read (source.clean_ranges); offsets past the verdicts
    (none in practice) get None."""
    batches: dict[int, tuple[dict[TopicPartitionKey, int], dict[TopicPartitionKey, int]]] = {}
    rest: tuple[dict[TopicPartitionKey, int], dict[TopicPartitionKey, int]] = ({}, {})
    for tp in sorted(end):
        pos = start.get(tp, 0)
        for b_end, ts in verdicts.get(tp, ()):
            if b_end <= pos:
                continue
            stop = min(b_end, end[tp])
            begins, ends = batches.setdefault(ts, ({}, {}))
            # Two batches of one time (no known case) merge: only the split can differ.
            begins.setdefault(tp, pos)
            ends[tp] = pos = stop
            if pos >= end[tp]:
                break
        if pos < end[tp]:
            rest[0][tp], rest[1][tp] = pos, end[tp]
    split = (min_partitions, max_records_per_partition, min_split_records)
    tasks: list[tuple[OffsetRange, int | None]] = [
        (rng, ts) for ts in sorted(batches) for rng in plan_ranges(*batches[ts], *split)
    ]
    return tasks + [(rng, None) for rng in plan_ranges(*rest, *split)]


def unread_clean(
    tasks: Sequence[tuple[OffsetRange, int | None]], counts_checkpoint: str, max_future_skew_ms: int
) -> list[tuple[OffsetRange, int | None]]:
    """The dead-letter tasks left once those a counting task marked clean (the same range, judged
    by the same batch time) are dropped on the driver: they would read nothing, and each costs a
    Python worker's start (~70 ms). A marker the driver does not see yet only costs a task that
    finds it, or reads the range, with the same result."""
    return [
        (rng, judged)
        for rng, judged in tasks
        if not is_clean(counts_checkpoint, rng, future_bound(judged or None, max_future_skew_ms))
    ]
