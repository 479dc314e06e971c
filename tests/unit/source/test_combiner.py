"""The combiner's semantics, pinned from a user's view: what one read task hands Spark for the
records it read (source.combiner; the rule is in its docstring and docs/architecture.md)."""

from __future__ import annotations

from datetime import UTC, datetime

import pyarrow as pa
import pytest

from ipcount.formats.accesslog import format_record
from ipcount.formats.arrow_parse import ChunkParser
from ipcount.source.combiner import BatchRules, Combiner, counts_heartbeat, reject_reasons

T0 = 1_767_225_600_000  # 2026-01-01T00:00:00Z, a window boundary
W = 5_000


def line(ip: str, ms: int) -> bytes:
    return format_record(ip, ms).encode()


def combine(values: list[bytes | None], rules: BatchRules, chunk: int = 1000) -> pa.RecordBatch:
    c = Combiner(rules)
    for i in range(0, len(values), chunk):
        c.add(pa.array(values[i : i + chunk], pa.binary()))
    return c.result()


def rows(batch: pa.RecordBatch) -> list[tuple[str, int | None, str | None, int, int | None, bool]]:
    def ms(t: datetime | None) -> int | None:
        return None if t is None else int(t.timestamp() * 1000)

    return [
        (r["kind"], ms(r["window_start"]), r["ip"], r["count"], ms(r["event_time"]), r["late"])
        for r in batch.to_pylist()
    ]


RULES = BatchRules(window_ms=W)


def test_records_at_window_edges_count_in_the_window_holding_their_second() -> None:
    got = rows(
        combine(
            [
                line("10.0.0.1", T0),  # the first second of window [T0, T0+5s)
                line("10.0.0.1", T0 + 4_000),  # its last second
                line("10.0.0.1", T0 + 5_000),  # the first second of the next window
                line("10.0.0.2", T0 - 1_000),  # the last second of the window before
            ],
            RULES,
        )
    )
    assert got == [
        ("counted", T0 - W, "10.0.0.2", 1, T0 - 1_000, False),
        ("counted", T0, "10.0.0.1", 2, T0 + 4_000, False),  # event_time: the newest record
        ("counted", T0 + W, "10.0.0.1", 1, T0 + 5_000, False),
    ]


def test_a_partition_becomes_one_row_per_window_and_client() -> None:
    values = [line(f"10.0.0.{i % 7}", T0 + (i % 23) * 1_000) for i in range(10_000)]
    batch = combine(values, RULES)
    keys = [(r[1], r[2]) for r in rows(batch)]
    assert len(keys) == len(set(keys)) == 5 * 7  # 23 seconds -> 5 windows, 7 clients
    assert sum(batch.column("count").to_pylist()) == 10_000
    # The watermark Spark derives (max event_time over rows) is the newest event time read.
    assert max(r[4] for r in rows(batch)) == T0 + 22_000


def test_malformed_records_mixed_in_are_tallied_not_counted_and_are_exactly_the_rejects() -> None:
    good = [line("10.0.0.1", T0 + 1_000)] * 3
    bad: list[bytes | None] = [b"junk", None, b"\xff" + good[0], good[0] + b"x"]
    values = [good[0], bad[0], good[1], bad[1], bad[2], good[2], bad[3]]
    got = rows(combine(values, RULES))
    assert got == [
        ("counted", T0, "10.0.0.1", 3, T0 + 1_000, False),
        ("malformed", None, None, 4, None, False),
    ]
    parsed = ChunkParser().parse(pa.array(values, pa.binary()))
    index, reasons = reject_reasons(parsed, RULES)
    assert index.tolist() == [1, 3, 4, 6]
    assert reasons == [
        "malformed: not a valid nginx combined-format line",
        "malformed: no value",
        "malformed: not UTF-8",
        "malformed: not a valid nginx combined-format line",
    ]


def test_the_same_records_give_identical_rows_however_they_are_chunked() -> None:
    values: list[bytes | None] = [
        line(f"2001:db8::{i % 13:x}" if i % 3 else f"10.1.0.{i % 11}", T0 + (i % 31) * 1_000)
        for i in range(3_000)
    ]
    values[17] = b"not a line"
    rules = BatchRules(W, 60_000, T0 + 60_000 + 20_000, T0 + 10_000)
    first = combine(values, rules, chunk=3_000)
    assert first.equals(combine(values, rules, chunk=3_000))  # a replay
    assert first.equals(combine(values, rules, chunk=7))  # other chunking
    assert first.equals(combine(values, rules, chunk=1_024))


def test_a_record_is_late_only_when_its_window_ended_at_or_before_late_before() -> None:
    late_before = T0 + 10_000  # the previous batch's watermark: windows ending by then emitted
    rules = BatchRules(W, late_before_ms=late_before)
    got = rows(
        combine(
            [
                line("10.0.0.1", T0 + 9_000),  # window [T0+5s, T0+10s): already emitted
                line("10.0.0.1", T0 + 10_000),  # window [T0+10s, T0+15s): still open
                line("10.0.0.1", T0 + 3_000),  # window [T0, T0+5s): emitted
            ],
            rules,
        )
    )
    assert got == [
        # Late rows count under their own window and ride on late_before (the carrier).
        ("counted", T0, "10.0.0.1", 1, late_before, True),
        ("counted", T0 + W, "10.0.0.1", 1, late_before, True),
        ("counted", T0 + 2 * W, "10.0.0.1", 1, T0 + 10_000, False),
    ]


def test_future_records_are_judged_by_the_batch_time_and_tallied() -> None:
    batch_ms, skew = T0, 300_000
    rules = BatchRules(W, skew, batch_ms + skew)
    at_limit, beyond = line("10.0.0.1", T0 + skew), line("10.0.0.1", T0 + skew + 1_000)
    got = rows(combine([at_limit, beyond, beyond], rules))
    assert got == [
        ("counted", T0 + skew, "10.0.0.1", 1, T0 + skew, False),
        ("future", None, None, 2, None, False),
    ]
    index, reasons = reject_reasons(ChunkParser().parse(pa.array([at_limit, beyond])), rules)
    assert index.tolist() == [1]
    assert reasons == ["future: event time more than 300 s ahead of its batch time"]


@pytest.mark.parametrize("spelling", ["2001:DB8:0:0::1", "2001:db8::1", "2001:0db8::0:1"])
def test_spellings_of_one_client_are_one_row(spelling: str) -> None:
    got = rows(combine([line("2001:db8::1", T0), line(spelling, T0)], RULES))
    assert got == [("counted", T0, "2001:db8::1", 2, T0, False)]


def test_an_empty_or_all_malformed_range_yields_no_count_rows() -> None:
    assert combine([], RULES).num_rows == 0
    assert rows(combine([b"x", b"y"], RULES)) == [("malformed", None, None, 2, None, False)]


def test_a_heartbeat_row_carries_only_an_event_time() -> None:
    assert rows(pa.Table.from_batches([counts_heartbeat(T0 + 7_000)]).to_batches()[0]) == [
        ("heartbeat", None, None, 0, T0 + 7_000, False)
    ]
    assert datetime.fromtimestamp(T0 / 1000, UTC).isoformat() == "2026-01-01T00:00:00+00:00"


def test_a_record_ahead_of_the_batch_clock_counts_in_its_window_but_rides_on_the_clock() -> None:
    """The watermark never passes the batch's time: a record within the skew but after the
    batch's time keeps its window, leaves as a correction, and carries the batch's time."""
    batch_ms, skew, late_before = T0 + 60_000, 300_000, T0 + 50_000
    rules = BatchRules(W, skew, batch_ms + skew, late_before, clock_ms=batch_ms)
    ahead = T0 + 60_000 + 299_000
    got = rows(
        combine(
            [
                line("10.0.0.1", T0 + 58_000),  # ordinary: on time, its own event time
                line("10.0.0.9", ahead),  # 299 s ahead of the batch's time
                line("10.0.0.1", T0 + 60_000),  # exactly the batch's time: not ahead
            ],
            rules,
        )
    )
    assert got == [
        ("counted", T0 + 55_000, "10.0.0.1", 1, T0 + 58_000, False),
        ("counted", T0 + 60_000, "10.0.0.1", 1, T0 + 60_000, False),
        ("counted", ahead - ahead % W, "10.0.0.9", 1, batch_ms, True),
    ]
    assert max(r[4] for r in got if r[4] is not None) <= batch_ms
