"""The dead-letter query follows the counting query's batches (no broker): what it may read and
which batch time judges each record."""

from __future__ import annotations

from ipcount.source.follow import plan_followed
from ipcount.source.offsets import (
    OffsetRange,
    SourceOffset,
    follow_batches,
)

P0, P1 = ("src", 0), ("src", 1)


def test_reads_only_what_the_counting_query_planned() -> None:
    batches = [({P0: 10, P1: 5}, 1_000), ({P0: 20, P1: 5}, 2_000), ({P0: 25, P1: 9}, 3_000)]
    end, verdicts = follow_batches({P0: 0, P1: 0}, {P0: 100, P1: 100}, batches, 16)
    assert end == {P0: 25, P1: 9}
    assert verdicts == {P0: ((10, 1_000), (20, 2_000), (25, 3_000)), P1: ((5, 1_000), (9, 3_000))}


def test_starts_mid_batch_and_stops_at_the_available_end() -> None:
    batches = [({P0: 10}, 1_000), ({P0: 20}, 2_000), ({P0: 30}, 3_000)]
    end, verdicts = follow_batches({P0: 12}, {P0: 25}, batches, 16)
    assert end == {P0: 25}
    assert verdicts == {P0: ((20, 2_000), (25, 3_000))}


def test_nothing_planned_yet_reads_nothing() -> None:
    end, verdicts = follow_batches({P0: 10}, {P0: 50}, [({P0: 10}, 1_000)], 16)
    assert (end, verdicts) == ({P0: 10}, {})


def test_at_most_max_batches_are_followed_at_once() -> None:
    batches = [({P0: 10 * (i + 1)}, 1_000 * (i + 1)) for i in range(40)]
    end, verdicts = follow_batches({P0: 0}, {P0: 1_000}, batches, 16)
    assert end == {P0: 160} and len(verdicts[P0]) == 16
    # The next batch continues where this one ended, with the next batches.
    end2, verdicts2 = follow_batches(end, {P0: 1_000}, batches, 16)
    assert end2 == {P0: 320} and verdicts2[P0][0] == (170, 17_000)


def test_ranges_are_cut_at_batch_ends_with_their_time() -> None:
    verdicts = {P0: ((20, 2_000), (25, 3_000)), P1: ((4, 1_000),)}
    assert plan_followed({P0: 12, P1: 0}, {P0: 25, P1: 4}, verdicts, None, None) == [
        (OffsetRange("src", 1, 0, 4), 1_000),
        (OffsetRange("src", 0, 12, 20), 2_000),
        (OffsetRange("src", 0, 20, 25), 3_000),
    ]
    # Offsets past the verdicts (none in practice) are judged without a batch time.
    assert plan_followed({P0: 20}, {P0: 30}, {P0: ((25, 3_000),)}, None, None) == [
        (OffsetRange("src", 0, 20, 25), 3_000),
        (OffsetRange("src", 0, 25, 30), None),
    ]


def test_verdicts_live_in_the_offset_and_survive_a_replay() -> None:
    offset = SourceOffset({P0: 25, P1: 9}, None, {P0: ((20, 2_000), (25, 3_000)), P1: ((9, 1),)})
    again = SourceOffset.from_json(offset.to_json())
    assert again == offset
    assert SourceOffset.from_json({"offsets": {"src": {"0": 3}}}).verdicts is None


def _tasks(options: dict[str, str], start: SourceOffset, end: SourceOffset) -> list:
    from ipcount.source.options import parse_options
    from ipcount.source.reader import KafkaStreamReader

    reader = KafkaStreamReader(
        parse_options({"subscribe": "src", "kafka.bootstrap.servers": "unused:9092", **options})
    )
    return [(t.range, t.batch_ms) for t in reader.partitions(start.to_json(), end.to_json())]


def test_dead_letter_tasks_read_exactly_the_ranges_the_counting_tasks_read() -> None:
    # The counting query's two batches, split into tasks by its options (clean-range markers
    # match only a range the counting query read as one task).
    split = {"minPartitions": "3", "maxRecordsPerPartition": "100"}
    batches = [({P0: 0, P1: 0}, {P0: 150, P1: 30}, 1_000), ({P0: 150, P1: 30}, {P0: 300}, 2_000)]
    counted = [
        (rng, ts)
        for begin, end, ts in batches
        for rng, _ in _tasks(split, SourceOffset(begin), SourceOffset({P1: 30, **end}))
    ]
    # The dead-letter query follows both batches in one of its own.
    dl_end, verdicts = follow_batches(
        {P0: 0, P1: 0}, {P0: 300, P1: 30}, [(e, ts) for _, e, ts in batches], 16
    )
    followed = _tasks(
        {**split, "output": "rejects", "eventTimeFormat": "nginx-combined"},
        SourceOffset({P0: 0, P1: 0}),
        SourceOffset(dl_end, None, verdicts),
    )
    assert sorted(followed, key=repr) == sorted(counted, key=repr)
