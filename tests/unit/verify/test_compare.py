"""The exactness rules of `ipcount verify` (no broker: results are fed in directly)."""

from __future__ import annotations

from ipcount.formats.avro import IpCount
from ipcount.verify.compare import compare
from ipcount.verify.ledger import Ledger
from ipcount.verify.watermark import SinkWatermark

W = 5000


def _ledger() -> Ledger:
    ledger = Ledger(window_ms=W)
    ledger.add(0, "10.0.0.1", 3)
    ledger.add(1000, "10.0.0.2", 1)
    ledger.add(W, "10.0.0.1", 2)
    ledger.add_late(20 * W, "10.0.0.9", 4)  # a window holding only late records
    return ledger


def _r(start: int, ip: str, count: int, length: int = W) -> tuple[str, IpCount]:
    return (f"sink[0]@{start}", IpCount(start, start + length, ip, count))


EXACT = [_r(0, "10.0.0.1", 3), _r(0, "10.0.0.2", 1), _r(W, "10.0.0.1", 2)]


def test_exact() -> None:
    report = compare(EXACT, _ledger())
    assert report.exact and not report.examples
    assert report.summary().endswith("results=3 missing=0 duplicates=0 wrong=0 exact=true")
    assert "records=3 expected=3 late_windows=1 late_emitted=0" in report.summary()


def test_missing_duplicate_and_wrong() -> None:
    results = [
        _r(0, "10.0.0.1", 3),
        _r(0, "10.0.0.1", 3),  # duplicate (same count)
        _r(0, "10.0.0.2", 2),  # wrong count
        # (W, 10.0.0.1) missing
        _r(3 * W, "10.0.0.5", 1),  # not in the ledger
    ]
    report = compare(results, _ledger())
    assert not report.exact
    assert report.summary().endswith("results=3 missing=1 duplicates=1 wrong=2 exact=false")
    text = "\n".join(report.examples)
    assert "duplicate window_start=0 ip=10.0.0.1" in text
    assert "wrong window_start=0 ip=10.0.0.2: count=2, expected 1" in text
    assert "missing window_start=5000 ip=10.0.0.1 expected count=2" in text
    assert "unexpected window_start=15000 ip=10.0.0.5" in text


def test_late_window_accepted_up_to_late_count() -> None:
    ok = compare([*EXACT, _r(20 * W, "10.0.0.9", 4)], _ledger())
    assert ok.exact and ok.late_emitted == 4
    partial = compare([*EXACT, _r(20 * W, "10.0.0.9", 1)], _ledger())
    assert partial.exact and partial.late_emitted == 1
    too_many = compare([*EXACT, _r(20 * W, "10.0.0.9", 5)], _ledger())
    assert too_many.wrong == 1 and "expected 1..4 (late 4)" in too_many.examples[0]


def test_ip_case_and_window_length() -> None:
    report = compare([_r(0, "10.0.0.1", 3, length=10_000)], _ledger())
    assert report.wrong == 1 and "length 10000 ms" in report.examples[0]
    # The ledger keys by canonical IP; the sink must write that spelling, nothing else.
    upper = Ledger(window_ms=W)
    upper.add(0, "2001:DB8::1", 1)
    upper.add(0, "::ffff:10.0.0.7", 1)
    assert compare([_r(0, "2001:db8::1", 1), _r(0, "10.0.0.7", 1)], upper).exact
    stray = compare([_r(0, "2001:DB8::1", 1), _r(0, "10.0.0.7", 1)], upper)
    assert not stray.exact and stray.missing == 1


def test_undecodable_records_are_wrong() -> None:
    report = compare([*EXACT, ("sink[1]@7 (bad fingerprint)", None)], _ledger())
    assert report.wrong == 1 and report.records == 4 and report.results == 3
    assert "undecodable sink[1]@7" in report.examples[0]


def test_examples_are_capped() -> None:
    ledger = Ledger(window_ms=W)
    for i in range(25):
        ledger.add(i * W, "10.0.0.1")
    report = compare([], ledger)
    assert report.missing == 25 and len(report.examples) == 10 and report.total_examples == 25


def test_with_corrections_final_plus_corrections_must_equal_every_total() -> None:
    ledger = _ledger()
    ledger.add_late(0, "10.0.0.1", 2)  # 2 more records of an emitted window, arriving late
    # The late-only window arrives in two corrections; [0, W) 10.0.0.1 in one.
    fixes = [_r(0, "10.0.0.1", 2), _r(20 * W, "10.0.0.9", 1), _r(20 * W, "10.0.0.9", 3)]
    report = compare(EXACT, ledger, corrections=fixes)
    assert report.exact, report.examples
    assert (report.corrections, report.corrected) == (3, 6)
    assert " corrections=3 corrected=6 " in report.summary()


def test_with_corrections_a_lost_or_doubled_correction_is_not_exact() -> None:
    ledger = _ledger()
    lost = compare(EXACT, ledger, corrections=[])
    assert lost.missing == 1 and not lost.exact  # the late-only window: nothing anywhere
    short = compare(EXACT, ledger, corrections=[_r(20 * W, "10.0.0.9", 3)])
    assert short.wrong == 1 and "expected 4" in short.examples[0]
    doubled = compare(
        EXACT, ledger, corrections=[_r(20 * W, "10.0.0.9", 4), _r(20 * W, "10.0.0.9", 4)]
    )
    assert doubled.wrong == 1 and not doubled.exact
    stray = compare(EXACT, ledger, corrections=[_r(20 * W, "10.0.0.9", 4), _r(0, "10.9.9.9", 1)])
    assert stray.wrong == 1 and "not in ledger" in stray.examples[0]


def test_with_corrections_a_late_record_counted_in_its_final_is_exact() -> None:
    """A late record read before its window was emitted is in the final count: no correction."""
    ledger = _ledger()
    report = compare([*EXACT, _r(20 * W, "10.0.0.9", 4)], ledger, corrections=[])
    assert report.exact and report.late_emitted == 4


# Open windows: the sink's watermark says how far the job has emitted. A window ending at or
# before it is closed (Spark emits a window once window.end <= watermark), so a ledger window
# without a result there is lost; one ending after it is still open in the job's state.


def _three_windows() -> Ledger:
    ledger = Ledger(window_ms=W)
    ledger.add(0, "10.0.0.1", 3)
    ledger.add(W, "10.0.0.1", 2)
    ledger.add(2 * W, "10.0.0.2", 4)
    return ledger


def test_a_window_ending_exactly_at_the_watermark_is_closed_so_its_absence_is_loss() -> None:
    mark = SinkWatermark(2 * W, "progress marker of query q batch 3")
    report = compare([_r(0, "10.0.0.1", 3)], _three_windows(), watermark=mark)
    assert (report.open, report.missing) == (1, 1) and not report.exact
    assert "missing window_start=5000 ip=10.0.0.1 expected count=2" in report.examples
    assert report.summary().endswith("open=1 results=1 missing=1 duplicates=0 wrong=0 exact=false")


def test_windows_ending_after_the_watermark_are_open_not_missing() -> None:
    mark = SinkWatermark(2 * W - 1, "progress marker of query q batch 3")
    report = compare([_r(0, "10.0.0.1", 3)], _three_windows(), watermark=mark)
    assert (report.open, report.missing) == (2, 0) and report.exact, report.examples
    assert report.summary().endswith("open=2 results=1 missing=0 duplicates=0 wrong=0 exact=true")
    hint = report.open_hint()
    assert hint is not None and "2 (window, ip) results" in hint
    assert "ipcount run --available-now --close-all-windows" in hint
    assert "progress marker of query q batch 3" in hint


def test_open_is_judged_in_corrections_mode_too() -> None:
    ledger = _three_windows()
    ledger.add_late(0, "10.0.0.1", 2)
    mark = SinkWatermark(W, "m")
    # [0, W) closed and complete with its correction; [W, 2W) and [2W, 3W) open.
    report = compare(
        [_r(0, "10.0.0.1", 3)], ledger, corrections=[_r(0, "10.0.0.1", 2)], watermark=mark
    )
    assert (report.open, report.missing) == (2, 0) and report.exact, report.examples
    lost = compare(
        [_r(0, "10.0.0.1", 3)], ledger, corrections=[], watermark=SinkWatermark(2 * W, "m")
    )
    assert (lost.open, lost.missing, lost.wrong) == (1, 1, 1) and not lost.exact


def test_without_a_watermark_every_absent_window_is_missing() -> None:
    report = compare([_r(0, "10.0.0.1", 3)], _three_windows())
    assert (report.open, report.missing) == (0, 2) and report.open_hint() is None
    assert "open=0 results=1 missing=2" in report.summary()
