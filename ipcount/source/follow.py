"""The dead-letter query follows the counting query's batches (driver only): it reads what that
query has planned, cut at that query's batch ends, and records those batches' times in its own
offsets, so both queries give each record one verdict, through replays too."""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence

from ipcount.errors import SourceError
from ipcount.source.clean_ranges import future_bound, is_clean
from ipcount.source.counted_batches import BATCHES_DIR, counted_batches, first_offsets
from ipcount.source.offsets import (
    OffsetRange,
    SourceOffset,
    TopicPartitionKey,
    Verdicts,
    follow_batches,
)
from ipcount.source.task_plan import plan_tasks

__all__ = ["CountsFollower", "follower_start", "plan_followed", "unread_clean"]

logger = logging.getLogger(__name__)

# The most batches of the counting query one dead-letter batch follows (its tasks are cut at their
# boundaries, so this bounds the tasks of a dead-letter query catching up).
MAX_FOLLOWED_BATCHES = 16


class CountsFollower:
    """Reads the counting query's offset log (`checkpoint`), each entry once, and the batches it
    kept past Spark's purge of that log (source.counted_batches)."""

    def __init__(self, checkpoint: str) -> None:
        self.checkpoint = checkpoint
        # batch id -> (end offsets, batch time ms)
        self._batches: dict[int, tuple[dict[TopicPartitionKey, int], int]] = {}
        self._warned = False

    def follow(
        self, start: dict[TopicPartitionKey, int], end: dict[TopicPartitionKey, int]
    ) -> tuple[dict[TopicPartitionKey, int], Verdicts]:
        """(the end this batch may read up to, the verdicts its records get).

        Raises:
            SourceError: offsets at `start` were read by counting batches no longer known (see
                `_check_known`).
        """
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
        known: dict[
            int, tuple[Mapping[TopicPartitionKey, int] | None, Mapping[TopicPartitionKey, int], int]
        ] = {}
        for batch_id, (ends, ts) in self._batches.items():
            known[batch_id] = (None, ends, ts)
        for batch_id, batch in counted_batches(self.checkpoint).items():
            # The kept record is what the counting query's own tasks were planned from.
            known[batch_id] = (batch.start, batch.end, batch.batch_ms)
        order = sorted(known)
        batches = []
        for batch_id in order:
            begin, batch_end, ts = known[batch_id]
            if begin is None and batch_id - 1 in known:
                begin = known[batch_id - 1][1]
            batches.append((begin, batch_end, ts))
        self._check_known(start, end, batches)
        return follow_batches(start, end, [(e, t) for _, e, t in batches], MAX_FOLLOWED_BATCHES)

    def _check_known(
        self,
        start: Mapping[TopicPartitionKey, int],
        end: Mapping[TopicPartitionKey, int],
        batches: Sequence[
            tuple[Mapping[TopicPartitionKey, int] | None, Mapping[TopicPartitionKey, int], int]
        ],
    ) -> None:
        """The first counting batch that read past `start` must have started at or before it:
        else the offsets in between were judged by batches neither Spark's offset log nor the
        kept records know, and no batch time can give them the verdict they got."""
        for tp in sorted(end):
            pos = start.get(tp, 0)
            if pos >= end[tp]:
                continue
            first = next(((b, e) for b, e, _ in batches if e.get(tp, 0) > pos), None)
            if first is None:
                continue
            begin = first[0]
            if begin is None:
                if not self._warned:
                    self._warned = True
                    logger.warning(
                        "dead letters of %s/%d from offset %d are judged by the oldest counting "
                        "batch Spark keeps: the batches before it were not recorded (a checkpoint "
                        "of an earlier ipcount version)",
                        *tp,
                        pos,
                    )
                continue
            if begin.get(tp, 0) > pos:
                raise SourceError(
                    f"the dead-letter query cannot follow {tp[0]}/{tp[1]} from offset {pos}: "
                    f"offsets {pos}-{begin.get(tp, 0) - 1} were judged by counting batches "
                    f"that {self.checkpoint} no longer records (its {BATCHES_DIR} were removed?), "
                    "so their verdicts are unknown. Restore that directory, or go on with a new "
                    "job.checkpoint_location and `ipcount run --new-query` (both queries "
                    "continue where their output ends; those offsets get no dead letter)"
                )


def follower_start(counts_checkpoint: str) -> dict[TopicPartitionKey, int] | None:
    """Where a new dead-letter query starts: where the oldest counting batch it can know starts
    (the counting query's first offsets, under `latest` and `--new-query` too, or the oldest
    batch it recorded), so every record that query judged gets one verdict; None when the
    counting query kept no such record (an earlier version's checkpoint: the dead-letter query's
    own startingOffsets apply, as before)."""
    from ipcount.checkpoint.offset_log import OffsetLog

    recorded = counted_batches(counts_checkpoint)
    ids = set(OffsetLog(counts_checkpoint).batch_ids()) | set(recorded)
    if not ids:
        return first_offsets(counts_checkpoint)
    oldest = min(ids)
    if oldest in recorded:
        return recorded[oldest].start
    return first_offsets(counts_checkpoint) if oldest == 0 else None


def plan_followed(
    start: Mapping[TopicPartitionKey, int],
    end: Mapping[TopicPartitionKey, int],
    verdicts: Verdicts,
    min_partitions: int | None,
    max_records_per_partition: int | None,
    min_split_records: int | None = None,
) -> list[tuple[OffsetRange, int | None]]:
    """The dead-letter tasks of one batch, with the batch time that judges each: every followed
    counting batch split as that query split it (plan_tasks over that batch's own start and end),
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
        (rng, ts)
        for ts in sorted(batches)
        for task in plan_tasks(*batches[ts], *split)
        for rng in task
    ]
    return tasks + [(rng, None) for task in plan_tasks(*rest, *split) for rng in task]


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
