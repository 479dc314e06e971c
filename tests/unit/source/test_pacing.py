"""Admission pacing: once per interval, a window-closing record at once, the trigger's tick."""

from __future__ import annotations

import pytest

from ipcount.source.pacing import Admission, tick_seconds

END = {("t", 0): 10}


class Tails:
    """The newest event time at the tails, as the planner's look would find it."""

    def __init__(self, ms: int | None) -> None:
        self.ms = ms
        self.looks = 0

    def __call__(self, end: dict[tuple[str, int], int]) -> int | None:
        self.looks += 1
        return self.ms


@pytest.mark.parametrize(
    ("interval", "tick"), [(1.0, 0.1), (0.5, 0.05), (0.2, 0.05), (0.03, 0.03), (60.0, 1.0)]
)
def test_the_trigger_ticks_at_a_tenth_of_the_interval_within_bounds(
    interval: float, tick: float
) -> None:
    assert tick_seconds(interval) == pytest.approx(tick)


def test_records_are_admitted_once_per_interval() -> None:
    pace = Admission(1000, 5000, 5000)
    assert pace.admits(100.0, END)  # the first plan
    assert not pace.admits(100.5, END)
    assert not pace.admits(100.9, END)
    # A tick a few ms early (half a tick of slack) still admits.
    assert pace.admits(100.96, END)
    assert not pace.admits(101.5, END)
    assert pace.admits(102.0, END)


def test_no_interval_admits_every_plan_without_looking() -> None:
    tails = Tails(10_000)
    pace = Admission(0, 5000, 5000, tails)
    assert all(pace.admits(100.0 + i / 100, END) for i in range(5))
    assert tails.looks == 0


def test_a_record_closing_a_window_is_admitted_at_once_and_only_once() -> None:
    tails = Tails(12_000)  # delay 5 s: closes windows ending at or before 7 s, i.e. [0, 5 s)
    pace = Admission(1000, 5000, 5000, tails)
    assert pace.admits(100.0, END)
    tails.ms = 14_999  # still only [0, 5 s) closed
    assert not pace.admits(100.2, END)
    tails.ms = 15_000  # closes [5 s, 10 s)
    assert pace.admits(100.3, END)
    # The admission starts the interval again; the same closing does not admit twice.
    assert not pace.admits(100.5, END)
    assert not pace.admits(101.2, END)
    assert pace.admits(101.3, END)


def test_an_unknown_tail_leaves_the_interval_to_decide() -> None:
    tails = Tails(None)
    pace = Admission(1000, 5000, 0, tails)
    assert pace.admits(100.0, END)
    tails.ms = 50_000
    # Nothing known at the last admission: no window can be said to close now.
    assert not pace.admits(100.5, END)
    assert pace.admits(101.0, END)
    tails.ms = 55_000
    assert pace.admits(101.1, END)
