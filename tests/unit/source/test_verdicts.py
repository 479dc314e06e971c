"""The dead-letter query follows the counting query's batches (no broker): what it may read and
which batch time judges each record."""

from __future__ import annotations

import pytest

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
    tasks = reader.partitions(start.to_json(), end.to_json())
    return [(rng, t.batch_ms) for t in tasks for rng in t.ranges]


@pytest.mark.parametrize(
    "split",
    [
        {"minPartitions": "3", "maxRecordsPerPartition": "100"},
        # Auto: equal tasks cut across partitions (a task reads the end of one and the start of
        # the next).
        {"minPartitions": "4", "minSplitRecords": "50"},
    ],
)
def test_dead_letter_tasks_read_exactly_the_ranges_the_counting_tasks_read(
    split: dict[str, str],
) -> None:
    # The counting query's two batches, split into tasks by its options (clean-range markers
    # match only a range the counting query read as one task).
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


def _spark_entry(ckpt, batch: int, end: SourceOffset, batch_ms: int) -> None:  # type: ignore[no-untyped-def]
    import json

    (ckpt / "offsets").mkdir(parents=True, exist_ok=True)
    meta = {"batchWatermarkMs": 0, "batchTimestampMs": batch_ms, "conf": {}}
    (ckpt / "offsets" / str(batch)).write_text(
        f"v1\n{json.dumps(meta)}\n{json.dumps(end.to_json())}"
    )


def test_records_keep_their_batch_time_after_spark_purges_the_offset_log(tmp_path) -> None:  # type: ignore[no-untyped-def]
    from ipcount.source.follow import CountsFollower

    counts = tmp_path / "counts"
    counting = {
        "output": "counts",
        "eventTimeFormat": "nginx-combined",
        "maxFutureSkewMs": "300000",
        "queryCheckpoint": str(counts),
        "cleanRangeMarkers": "true",
    }

    def batch_ms(i: int) -> int:
        return 1_700_000_000_000 + i * 1_000

    # 100 counting batches of 100 offsets each, planned as Spark plans them: the offset log
    # entry first, then the source's partitions().
    for i in range(100):
        end = SourceOffset({P0: (i + 1) * 100})
        _spark_entry(counts, i, end, batch_ms(i))
        _tasks(counting, SourceOffset({P0: i * 100}), end)
    # Spark keeps the newest entries only (minBatchesToRetain): 0-59 are gone.
    for i in range(60):
        (counts / "offsets" / str(i)).unlink()

    # The dead-letter query, far behind at offset 1000, follows up to 6100.
    follower = CountsFollower(str(counts))
    judged: dict[int, int | None] = {}
    pos = {P0: 1_000}
    while pos[P0] < 6_100:
        end, verdicts = follower.follow(pos, {P0: 6_100})
        assert end[P0] > pos[P0], "the dead-letter query stopped following"
        for rng, ts in plan_followed(pos, end, verdicts, None, None):
            for offset in range(rng.start, rng.end):
                judged[offset] = ts
        pos = end
    # Each record is judged by the batch time of the counting batch that read it.
    wrong = {o: ts for o, ts in judged.items() if ts != batch_ms(o // 100)}
    assert not wrong, f"{len(wrong)} offsets judged by another batch's time, e.g. " + str(
        sorted(wrong.items())[:3]
    )
    assert sorted(judged) == list(range(1_000, 6_100))


def test_a_new_dead_letter_query_starts_at_the_counting_query_s_first_batch(tmp_path) -> None:  # type: ignore[no-untyped-def]
    from ipcount.source.counted_batches import CountedBatch, keep_first_offsets, record_batch
    from ipcount.source.follow import follower_start

    counts = str(tmp_path / "counts")
    assert follower_start(counts) is None  # nothing known: its own startingOffsets apply
    # startingOffsets=latest resolved when the counting query started; no batch planned yet.
    keep_first_offsets(counts, {P0: 500, P1: 70})
    assert follower_start(counts) == {P0: 500, P1: 70}
    # A later resolution (a restart before the first batch) keeps the first one.
    assert (
        keep_first_offsets(counts, {P0: 900, P1: 90}) == SourceOffset({P0: 500, P1: 70}).to_json()
    )
    record_batch(counts, CountedBatch(0, {P0: 500, P1: 70}, {P0: 600, P1: 80}, 1_000))
    record_batch(counts, CountedBatch(1, {P0: 600, P1: 80}, {P0: 700, P1: 90}, 2_000))
    assert follower_start(counts) == {P0: 500, P1: 70}


def test_offsets_no_kept_batch_judged_are_refused_with_how_to_go_on(tmp_path) -> None:  # type: ignore[no-untyped-def]
    import pytest

    from ipcount.errors import SourceError
    from ipcount.source.counted_batches import CountedBatch, record_batch
    from ipcount.source.follow import CountsFollower

    counts = str(tmp_path / "counts")
    record_batch(counts, CountedBatch(7, {P0: 500}, {P0: 600}, 1_000))
    with pytest.raises(SourceError, match=r"offsets 100-499 .*--new-query"):
        CountsFollower(counts).follow({P0: 100}, {P0: 600})
    end, verdicts = CountsFollower(counts).follow({P0: 500}, {P0: 600})
    assert (end, verdicts) == ({P0: 600}, {P0: ((600, 1_000),)})
