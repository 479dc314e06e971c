"""When the source counts as idle (driver): from the first plan that finds no new records, so the
batch Spark runs right after a long batch (to apply the watermark it moved) carries no heartbeat
and pays no newest-event-time lookup; heartbeats follow once the source stays idle."""

from __future__ import annotations

from typing import Any

import pytest

from ipcount.source import heartbeats
from ipcount.source.heartbeats import HeartbeatPlanner
from ipcount.source.offsets import SourceOffset
from ipcount.source.options import parse_options

TP = ("access", 0)


class _Offsets:
    """The offset reader as the planner uses it: the newest event time before the given ends."""

    def __init__(self) -> None:
        self.lookups = 0

    def latest_event_ms(self, ends: Any, now_ms: int | None = None) -> int:
        self.lookups += 1
        return 1_795_000_000_000


class _Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def monotonic(self) -> float:
        return self.now

    def time(self) -> float:
        return 1_795_000_100.0


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> _Clock:
    fake = _Clock()
    monkeypatch.setattr(heartbeats, "time", fake)
    return fake


def test_the_idle_clock_starts_at_the_first_plan_without_new_records(clock: _Clock) -> None:
    options = parse_options(
        {"subscribe": "access", "kafka.bootstrap.servers": "127.0.0.1:9", "idleTimeoutMs": "2000"}
    )
    offsets = _Offsets()
    planner = HeartbeatPlanner(options, offsets)
    end = SourceOffset({TP: 1_000_000})
    planner.records_read()  # a batch of a million records is planned ...
    clock.now += 7.0  # ... and takes 7 s
    # The next plan finds nothing new: Spark runs it anyway (the watermark moved), without a
    # heartbeat, and nothing is looked up.
    assert planner.next(end, {TP: 1_000_000}, False) is None
    assert offsets.lookups == 0
    clock.now += 1.0
    assert planner.next(end, {TP: 1_000_000}, False) is None  # idle 1 s < 2 s
    clock.now += 1.5
    beat = planner.next(end, {TP: 1_000_000}, False)  # idle 2.5 s: the windows may close
    assert beat is not None and beat.base == 1_795_000_000_000 and offsets.lookups == 1


def test_heartbeats_start_no_later_than_the_planning_clock(clock: _Clock) -> None:
    """A record stamped within the future skew (here 299 s ahead of the clock) is the newest
    event time, but heartbeats must not carry the watermark past the clock."""

    class _Ahead(_Offsets):
        def latest_event_ms(self, ends: Any, now_ms: int | None = None) -> int:
            return 1_795_000_100_000 + 299_000

    options = parse_options(
        {
            "subscribe": "access",
            "kafka.bootstrap.servers": "127.0.0.1:9",
            "idleTimeoutMs": "2000",
            "maxFutureSkewMs": "300000",
            "queryCheckpoint": "/unused",
        }
    )
    planner = HeartbeatPlanner(options, _Ahead())
    end = SourceOffset({TP: 10})
    planner.records_read()
    assert planner.next(end, {TP: 10}, False) is None
    clock.now += 2.5
    beat = planner.next(end, {TP: 10}, False)
    assert beat is not None and beat.base == 1_795_000_100_000, beat
