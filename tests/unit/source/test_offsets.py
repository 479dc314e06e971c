"""Offset arithmetic of the Kafka source: offset JSON, limit spreading, task ranges, heartbeat rules."""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

import pytest

from ipcount.errors import SourceError
from ipcount.source.offsets import (
    Heartbeat,
    OffsetRange,
    SourceOffset,
    flush_heartbeat,
    next_heartbeat,
    parse_starting_offsets,
    spread_limit,
)
from ipcount.source.task_plan import group_ranges, plan_tasks


def plan_ranges(*args: Any, **kwargs: Any) -> list[OffsetRange]:
    """Every range of plan_tasks, in task order (what the dead-letter query re-plans)."""
    return [r for task in plan_tasks(*args, **kwargs) for r in task]


def test_offset_json_round_trip_and_fixed_key_order() -> None:
    offsets = {("b", 10): 5, ("b", 2): 7, ("a", 0): 1}
    off = SourceOffset(offsets, Heartbeat(seq=3, ts=1_000, base=900))
    doc = off.to_json()
    # Spark compares offsets as JSON strings: the same offsets must always give the same text.
    assert json.dumps(doc) == json.dumps(
        SourceOffset(dict(reversed(offsets.items())), off.heartbeat).to_json()
    )
    assert list(doc["offsets"]) == ["a", "b"]
    assert list(doc["offsets"]["b"]) == ["2", "10"]
    assert SourceOffset.from_json(json.loads(json.dumps(doc))) == off
    assert SourceOffset.from_json(json.dumps(doc)) == off
    assert "heartbeat" not in SourceOffset(offsets).to_json()


@pytest.mark.parametrize(
    "bad", [{}, {"t": {"0": 1}}, {"offsets": {"t": {"x": 1}}}, {"offsets": [1]}]
)
def test_offset_from_foreign_json_is_a_source_error(bad: object) -> None:
    with pytest.raises(SourceError, match="not an ipcount-kafka offset"):
        SourceOffset.from_json(bad)


def test_parse_starting_offsets() -> None:
    assert parse_starting_offsets(" Earliest ", ["t"]) == "earliest"
    assert parse_starting_offsets("latest", ["t"]) == "latest"
    assert parse_starting_offsets('{"t": {"0": 23, "1": -2}, "u": {"0": -1}}', ["t", "u"]) == {
        ("t", 0): 23,
        ("t", 1): -2,
        ("u", 0): -1,
    }
    with pytest.raises(SourceError, match="not in subscribe"):
        parse_starting_offsets('{"x": {"0": 1}}', ["t"])
    with pytest.raises(SourceError, match="must be 'earliest'"):
        parse_starting_offsets("first", ["t"])
    with pytest.raises(SourceError, match="-2 \\(earliest\\)"):
        parse_starting_offsets('{"t": {"0": -3}}', ["t"])
    with pytest.raises(SourceError, match="must be integers"):
        parse_starting_offsets('{"t": {"zero": 1}}', ["t"])


def test_spread_limit_under_the_limit_admits_everything() -> None:
    start = {("t", 0): 10, ("t", 1): 0}
    latest = {("t", 0): 15, ("t", 1): 3, ("t", 2): 4}  # partition 2 is new: starts at 0
    assert spread_limit(start, latest, 100) == latest


def test_spread_limit_is_proportional_and_hands_out_the_remainder() -> None:
    start = {("t", 0): 0, ("t", 1): 0, ("t", 2): 0}
    # Equal lags: 10 = 3 + 3 + 3 + a remainder of 1, which goes to the first partition.
    assert spread_limit(start, {("t", 0): 30, ("t", 1): 30, ("t", 2): 30}, 10) == {
        ("t", 0): 4,
        ("t", 1): 3,
        ("t", 2): 3,
    }
    # Lags 90/9/1, limit 10: exact shares 9, 0.9, 0.1 -> 9, then the remainder goes to the 0.9.
    end = spread_limit(
        {("t", 0): 100, ("t", 1): 0, ("t", 2): 5}, {("t", 0): 190, ("t", 1): 9, ("t", 2): 6}, 10
    )
    assert end == {("t", 0): 109, ("t", 1): 1, ("t", 2): 5}


def test_spread_limit_properties_on_random_cases() -> None:
    rng = random.Random(7)
    for _ in range(2_000):
        n = rng.randint(1, 8)
        start = {("t", p): rng.randint(0, 1_000) for p in range(n)}
        latest = {tp: s + rng.choice([0, 0, 1, rng.randint(0, 10_000)]) for tp, s in start.items()}
        if rng.random() < 0.2:  # a new partition, absent from start
            latest[("u", 0)] = rng.randint(0, 500)
        limit = rng.randint(1, 5_000)
        end = spread_limit(start, latest, limit)
        lags = {tp: latest[tp] - start.get(tp, 0) for tp in latest}
        total = sum(lags.values())
        taken = {tp: end[tp] - start.get(tp, 0) for tp in latest}
        assert sum(taken.values()) == min(limit, total)
        for tp in latest:
            assert 0 <= taken[tp] <= lags[tp]
            if total > limit:
                # Within one offset of the exact proportional share.
                assert abs(taken[tp] - limit * lags[tp] / total) < 1


def test_plan_ranges_one_task_per_partition_with_data() -> None:
    start = {("t", 0): 5, ("t", 1): 7, ("t", 2): 9}
    end = {("t", 0): 10, ("t", 1): 7, ("t", 2): 4, ("t", 3): 2}  # 1 empty, 2 moved back, 3 new
    assert plan_ranges(start, end) == [OffsetRange("t", 0, 5, 10), OffsetRange("t", 3, 0, 2)]
    assert plan_ranges(start, end, min_partitions=1) == plan_ranges(start, end)


def test_plan_ranges_min_partitions_splits_large_ranges_proportionally() -> None:
    start = {("t", 0): 0, ("t", 1): 100, ("t", 2): 0}
    end = {("t", 0): 900, ("t", 1): 190, ("t", 2): 10}
    ranges = plan_ranges(start, end, min_partitions=10)
    by_tp: dict[int, list[OffsetRange]] = {}
    for r in ranges:
        by_tp.setdefault(r.partition, []).append(r)
    # 900/1000*10 = 9 tasks, 90/1000*10 = 0.9 -> 1, 10/1000*10 = 0.1 -> at least 1.
    assert [len(by_tp[p]) for p in (0, 1, 2)] == [9, 1, 1]
    assert [r.size for r in by_tp[0]] == [100] * 9
    for p, parts in by_tp.items():
        # Contiguous, covering exactly [start, end).
        assert parts[0].start == start[("t", p)] and parts[-1].end == end[("t", p)]
        assert all(a.end == b.start for a, b in zip(parts, parts[1:], strict=False))


def test_plan_ranges_never_splits_below_one_offset_and_spreads_round_off() -> None:
    ranges = plan_ranges({("t", 0): 0}, {("t", 0): 3}, min_partitions=8)
    assert ranges == [
        OffsetRange("t", 0, 0, 1),
        OffsetRange("t", 0, 1, 2),
        OffsetRange("t", 0, 2, 3),
    ]
    sizes = [r.size for r in plan_ranges({("t", 0): 0}, {("t", 0): 10}, min_partitions=3)]
    assert sizes == [3, 3, 4]


def test_plan_ranges_min_split_records_leaves_small_ranges_whole() -> None:
    """A live batch of a few thousand records per partition: one task per partition; a backlog's
    large ranges are still split to keep every core busy."""
    start = {("t", 0): 0, ("t", 1): 0, ("t", 2): 0}
    small = {("t", 0): 5_139, ("t", 1): 4_299, ("t", 2): 9_852}
    assert plan_ranges(start, small, min_partitions=4) != plan_ranges(start, small)
    assert plan_ranges(start, small, 4, None, 50_000) == plan_ranges(start, small)
    large = {("t", 0): 333_000, ("t", 1): 333_000, ("t", 2): 120_000}
    # Four tasks of 196,500 records, the partitions taken end to end (cut where a task ends).
    sizes = [r.size for r in plan_ranges(start, large, 4, None, 50_000)]
    assert sizes == [196_500, 136_500, 60_000, 196_500, 76_500, 120_000]
    # Never into parts below the minimum: 120k records split at most in two.
    parts = plan_ranges({("t", 0): 0}, {("t", 0): 120_000}, 8, None, 50_000)
    assert [r.size for r in parts] == [60_000, 60_000]


def test_small_ranges_share_a_read_task() -> None:
    """A live batch of a few thousand records over three partitions is read by one task: each
    task costs a Python worker's hand-over and a Kafka consumer, more than reading the records.
    Ranges worth a task of their own (min_split_records each) keep one."""
    small = [OffsetRange("t", p, 0, 500 + p) for p in range(3)]
    assert group_ranges(small, 50_000) == [small]
    mid = [OffsetRange("t", p, 0, 40_000) for p in range(3)]  # 120k: two tasks' worth
    assert sorted(len(g) for g in group_ranges(mid, 50_000)) == [1, 2]
    assert sorted(r.partition for g in group_ranges(mid, 50_000) for r in g) == [0, 1, 2]
    large = [OffsetRange("t", p, 0, 60_000) for p in range(3)]
    assert group_ranges(large, 50_000) == [[r] for r in large]
    # An explicit split (job.min_partitions or max_records_per_partition): one task per range.
    assert group_ranges(small, None) == [[r] for r in small]
    assert group_ranges([], 50_000) == []


def test_plan_ranges_max_records_per_partition_caps_every_task() -> None:
    start = {("t", 0): 0, ("t", 1): 10, ("t", 2): 0}
    end = {("t", 0): 250, ("t", 1): 110, ("t", 2): 7}
    ranges = plan_ranges(start, end, max_records_per_partition=100)
    assert [(r.partition, r.start, r.end) for r in ranges] == [
        (0, 0, 83),
        (0, 83, 166),
        (0, 166, 250),
        (1, 10, 110),
        (2, 0, 7),
    ]
    # Small batches (low-latency steady state) keep one task per partition.
    assert plan_ranges(start, end, max_records_per_partition=1000) == plan_ranges(start, end)


def test_plan_ranges_min_partitions_and_max_records_take_the_larger_split() -> None:
    start, end = {("t", 0): 0, ("t", 1): 0}, {("t", 0): 900, ("t", 1): 100}
    # minPartitions=10 gives 9 + 1 tasks; max 50 records asks for 18 + 2: the larger wins.
    sizes = [
        r.size for r in plan_ranges(start, end, min_partitions=10, max_records_per_partition=50)
    ]
    assert sizes == [50] * 20
    sizes = [
        r.size for r in plan_ranges(start, end, min_partitions=10, max_records_per_partition=500)
    ]
    assert sizes == [100] * 10


def test_next_heartbeat_waits_for_idle_timeout_and_advances_with_idle_time() -> None:
    kw = {"idle_timeout_ms": 2_000, "max_advance_ms": 10_000, "interval_ms": 1_000}
    assert next_heartbeat(None, 50_000, 1_999, **kw) is None
    first = next_heartbeat(None, 50_000, 2_300, **kw)
    assert first == Heartbeat(seq=1, ts=52_300, base=50_000)
    # Less than interval_ms later: nothing (each heartbeat costs a micro-batch).
    assert next_heartbeat(first, 50_000, 3_000, **kw) is None
    second = next_heartbeat(first, 50_000, 3_400, **kw)
    assert second == Heartbeat(seq=2, ts=53_400, base=50_000)
    # Capped at base + max_advance_ms, even when the last step is shorter than the interval.
    near = Heartbeat(seq=9, ts=59_500, base=50_000)
    assert next_heartbeat(near, 50_000, 30_000, **kw) == Heartbeat(seq=10, ts=60_000, base=50_000)
    # And nothing after the cap.
    capped = Heartbeat(seq=10, ts=60_000, base=50_000)
    assert next_heartbeat(capped, 50_000, 60_000, **kw) is None
    # Off when idle_timeout_ms is 0.
    assert (
        next_heartbeat(None, 50_000, 99_000, idle_timeout_ms=0, max_advance_ms=1, interval_ms=0)
        is None
    )


def test_flush_heartbeat_at_the_cap_then_one_more_batch() -> None:
    assert flush_heartbeat(None, 1_000, 500) == Heartbeat(seq=1, ts=1_500, base=1_000)
    assert flush_heartbeat(Heartbeat(2, 1_200, 1_000), 1_000, 500) == Heartbeat(3, 1_500, 1_000)
    # The second flush is the batch that applies the watermark the first one moved.
    assert flush_heartbeat(Heartbeat(3, 1_500, 1_000), 1_000, 500) == Heartbeat(4, 1_501, 1_000)
    assert flush_heartbeat(Heartbeat(4, 1_501, 1_000), 1_000, 500) is None


def _counting_tasks(
    start: dict, end: dict, cores: int, checkpoint: Path
) -> list[list[OffsetRange]]:
    """The read tasks the counting query plans for one batch, with the default settings
    (job.min_partitions = 0: auto) on `cores` cores: each task's offset ranges."""
    from ipcount.config.settings import Settings
    from ipcount.source.options import parse_options, source_options
    from ipcount.source.reader import KafkaStreamReader

    opts = source_options(Settings(), cores=cores, query_checkpoint=str(checkpoint))
    opts["kafka.bootstrap.servers"] = "unused:9092"
    reader = KafkaStreamReader(parse_options(opts))
    begin, finish = SourceOffset(start).to_json(), SourceOffset(end).to_json()
    # The batch as Spark's offset log holds it (its time judges future records).
    log = checkpoint / "offsets"
    log.mkdir(parents=True, exist_ok=True)
    (log / "0").write_text(f'v1\n{{"batchTimestampMs": 1}}\n{json.dumps(finish)}')
    tasks = reader.partitions(begin, finish)
    return [list(t.ranges) for t in tasks]


@pytest.mark.parametrize(
    "sizes",
    [(166_667, 166_667, 166_666), (333_000, 333_000, 120_000), (500_000,), (250_000, 250_000)],
)
def test_a_backlog_batch_keeps_every_core_busy_to_its_end(
    sizes: tuple[int, ...], tmp_path: Path
) -> None:
    """Auto split on 2 cores: a backlog batch is read by 4 tasks of (almost) the same size, so
    both cores work until the batch's last record; three partitions used to make 3 tasks (2
    cores, then 1: a quarter of the map stage's core time idle). The tasks cover every offset
    once, each a run of consecutive ranges."""
    start = {("src", p): 1_000 for p in range(len(sizes))}
    end = {("src", p): 1_000 + n for p, n in enumerate(sizes)}
    tasks = _counting_tasks(start, end, 2, tmp_path)
    task_sizes = [sum(r.size for r in t) for t in tasks]
    assert len(tasks) == 4
    assert max(task_sizes) - min(task_sizes) <= 1
    pieces = sorted((r for t in tasks for r in t), key=lambda r: (r.partition, r.start))
    for p, n in enumerate(sizes):
        mine = [r for r in pieces if r.partition == p]
        assert mine[0].start == 1_000 and mine[-1].end == 1_000 + n
        assert all(a.end == b.start for a, b in zip(mine, mine[1:], strict=False))


def test_a_live_batch_is_still_one_task(tmp_path: Path) -> None:
    """A few thousand records over three partitions: one task reads them all (a task's fixed
    cost outweighs what splitting saves); two tasks' worth: two tasks of the same size."""
    start = {("src", p): 0 for p in range(3)}
    small = _counting_tasks(
        start, {("src", 0): 5_139, ("src", 1): 4_299, ("src", 2): 9_852}, 2, tmp_path
    )
    assert [[(r.partition, r.start, r.end) for r in t] for t in small] == [
        [(0, 0, 5_139), (1, 0, 4_299), (2, 0, 9_852)]
    ]
    mid = _counting_tasks(start, {("src", p): 40_000 for p in range(3)}, 2, tmp_path)
    assert [sum(r.size for r in t) for t in mid] == [60_000, 60_000]
