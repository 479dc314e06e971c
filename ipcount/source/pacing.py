"""Admission pacing (driver only): new records enter a micro-batch at most once per batch interval,
except records that close a window, which enter at once; Spark's trigger ticks often, so the batch
that emits the windows a batch's watermark closed runs right after it, not one interval later."""

from __future__ import annotations

from collections.abc import Callable

__all__ = ["Admission", "tick_seconds"]

# Spark's trigger ticks at a tenth of the batch interval, within these bounds: often enough that
# the emitting batch follows at once, rarely enough that an idle query's planning costs nothing.
_MIN_TICK_S = 0.05
_MAX_TICK_S = 1.0

# The newest event time among the last records before the given end offsets (None: unknown).
Peek = Callable[[dict[tuple[str, int], int]], "int | None"]


def tick_seconds(interval_s: float) -> float:
    """The processing-time trigger a query with batch interval `interval_s` (> 0) runs on."""
    return min(interval_s, _MAX_TICK_S, max(_MIN_TICK_S, interval_s / 10))


class Admission:
    """When the planner may admit the new records up to `end`: the first plan always; later ones
    once `interval_ms` passed since the last admission (less half a tick, so that a tick landing
    a few milliseconds early is not held for a whole tick more), or at once when the newest event
    time at the partitions' tails (`peek`) closes a window that the records admitted so far did
    not: its result then costs one batch to read that record and one to emit, without waiting
    out the interval. That happens once per window at most.

    Only the planner's choice of end offsets depends on this, and Spark writes that choice to
    the offset log before the batch runs: a replayed batch reads what it logged, never this
    clock, nor the tails.
    """

    def __init__(
        self, interval_ms: int, window_ms: int, delay_ms: int, peek: Peek | None = None
    ) -> None:
        self.interval_ms = interval_ms
        self._window_ms = max(1, window_ms)
        self._delay_ms = delay_ms
        self._peek = peek
        self._slack_ms = tick_seconds(interval_ms / 1000) * 500 if interval_ms > 0 else 0.0
        self._last: float | None = None
        self._closed: int | None = None

    def admits(self, now: float, end: dict[tuple[str, int], int]) -> bool:
        """May the records up to `end` be admitted at `now` (time.monotonic())? True is recorded
        as an admission."""
        if self.interval_ms <= 0:
            return True
        due = self._last is None or (now - self._last) * 1000 + self._slack_ms >= self.interval_ms
        closed = self._windows_closed(end)
        if not due and (closed is None or self._closed is None or closed <= self._closed):
            return False
        self._last = now
        if closed is not None:
            self._closed = closed if self._closed is None else max(self._closed, closed)
        return True

    def _windows_closed(self, end: dict[tuple[str, int], int]) -> int | None:
        """How many windows since the epoch the tails' newest event time closes."""
        if self._peek is None:
            return None
        newest = self._peek(end)
        if newest is None:
            return None
        return (newest - self._delay_ms) // self._window_ms
