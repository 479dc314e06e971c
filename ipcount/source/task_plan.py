"""Which offset ranges each read task of a batch reads (no broker; runs on the driver).

Deterministic from the batch's start and end offsets alone: a replayed batch plans the same
tasks, and the dead-letter query re-plans a counting batch's ranges exactly (source.follow, whose
clean-range markers match only a range a counting task read whole: source.clean_ranges).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from ipcount.source.offsets import OffsetRange, TopicPartitionKey

__all__ = ["plan_tasks", "group_ranges"]


def plan_tasks(
    start: Mapping[TopicPartitionKey, int],
    end: Mapping[TopicPartitionKey, int],
    min_partitions: int | None = None,
    max_records_per_partition: int | None = None,
    min_split_records: int | None = None,
) -> list[list[OffsetRange]]:
    """The read tasks of a batch, each the offset ranges it reads one after the other.

    An explicit split (no `min_split_records`): one task per range of `_split_each`, like Spark's
    Kafka source. Auto (`min_split_records`, with `min_partitions` twice the cores): a batch over
    no more partitions than `min_partitions` is cut into tasks of the same size, the partitions'
    ranges taken end to end, as many as `min_partitions` allows with none below
    `min_split_records` (and none above `max_records_per_partition`). A backlog batch over three
    partitions on two cores is then four tasks of a quarter each, so both cores work to the
    batch's end (one task per partition left one core idle for the third); a live batch of a few
    thousand records is one task. Over more partitions, whole ranges share tasks
    (`group_ranges`).
    """
    ranges = _nonempty(start, end)
    if not min_split_records:
        return [[r] for r in _split_each(ranges, min_partitions, max_records_per_partition)]
    if not min_partitions or len(ranges) > min_partitions:
        split = _split_each(ranges, None, max_records_per_partition)
        return group_ranges(split, min_split_records)
    total = sum(r.size for r in ranges)
    tasks = max(1, min(min_partitions, total // min_split_records))
    if max_records_per_partition:
        tasks = max(tasks, -(-total // max_records_per_partition))
    return _slices(ranges, min(tasks, total))


def _nonempty(
    start: Mapping[TopicPartitionKey, int], end: Mapping[TopicPartitionKey, int]
) -> list[OffsetRange]:
    """The non-empty offset ranges between two offsets, in topic, partition order. Partitions
    missing from `start` are new and start at 0; ranges whose end lies before their start (data
    loss the driver already reported) are skipped."""
    return [
        OffsetRange(topic, partition, start.get((topic, partition), 0), end[(topic, partition)])
        for topic, partition in sorted(end)
        if end[(topic, partition)] > start.get((topic, partition), 0)
    ]


def _slices(ranges: Sequence[OffsetRange], tasks: int) -> list[list[OffsetRange]]:
    """`ranges` taken end to end, cut into `tasks` (at most their records) runs of sizes that
    differ by at most one; a range cut between two tasks gives each its part."""
    total = sum(r.size for r in ranges)
    bounds = [(i + 1) * total // tasks for i in range(tasks)]  # strictly increasing
    out: list[list[OffsetRange]] = []
    current: list[OffsetRange] = []
    done = 0
    for r in ranges:
        begin = r.start
        while begin < r.end:
            cut = min(r.end, begin + bounds[len(out)] - done)
            current.append(OffsetRange(r.topic, r.partition, begin, cut))
            done += cut - begin
            begin = cut
            if done == bounds[len(out)]:
                out.append(current)
                current = []
    return out


def _split_each(
    ranges: Sequence[OffsetRange],
    min_partitions: int | None,
    max_records_per_partition: int | None,
) -> list[OffsetRange]:
    """`ranges`, each split on its own, sizes as even as possible, never more parts than
    records:
    - min_partitions exceeding the number of ranges: a range gets
      max(1, round(size / total * min_partitions)) parts;
    - max_records_per_partition: a range gets at least ceil(size / max) parts;
    whichever asks for more.
    """
    spread = min_partitions if min_partitions and min_partitions > len(ranges) else 0
    if not spread and not max_records_per_partition:
        return list(ranges)
    total = sum(r.size for r in ranges)
    out: list[OffsetRange] = []
    for r in ranges:
        parts = 1
        if spread:
            # Round half up in integers: floor((2 * size * min + total) / (2 * total)).
            parts = max(1, (2 * r.size * spread + total) // (2 * total))
        if max_records_per_partition:
            parts = max(parts, -(-r.size // max_records_per_partition))
        parts = min(parts, r.size)
        remaining, begin = r.size, r.start
        for i in range(parts):
            this = remaining // (parts - i)
            remaining -= this
            out.append(OffsetRange(r.topic, r.partition, begin, begin + this))
            begin += this
    return out


def group_ranges(
    ranges: Sequence[OffsetRange], min_split_records: int | None
) -> list[list[OffsetRange]]:
    """The read tasks of whole ranges: with `min_split_records` (auto splitting), ranges that
    together hold fewer records than that many per task share tasks, balanced by size (the
    largest range first into the emptiest task); each task's ranges in topic, partition order.

    A live batch of a few thousand records over many partitions is then one task, not one per
    partition: a task costs a Python worker's hand-over and a Kafka consumer (tens of ms of Spark
    and client set-up), more than its records (~2 us each). Without it (an explicit split), one
    task per range.
    """
    if not min_split_records:
        return [[r] for r in ranges]
    tasks = max(1, min(len(ranges), sum(r.size for r in ranges) // min_split_records))
    if tasks >= len(ranges):
        return [[r] for r in ranges]
    groups: list[list[OffsetRange]] = [[] for _ in range(tasks)]
    sizes = [0] * tasks
    for r in sorted(ranges, key=lambda r: (-r.size, r.topic, r.partition, r.start)):
        emptiest = sizes.index(min(sizes))
        groups[emptiest].append(r)
        sizes[emptiest] += r.size
    ordered = [sorted(g, key=lambda r: (r.topic, r.partition, r.start)) for g in groups]
    return sorted(ordered, key=lambda g: (g[0].topic, g[0].partition, g[0].start))
