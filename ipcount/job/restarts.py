"""The restart budget of a job that runs for months: like Flink's failure-rate strategy, at most
`attempts` restarts within `window` seconds, so transient faults weeks apart never add up to a
stop while a query that fails at every start still stops."""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable

__all__ = ["RestartBudget"]


class RestartBudget:
    """At most `attempts` restarts within any `window` seconds (0: over the budget's whole life,
    Flink's fixed-delay strategy). `clock`: monotonic seconds.

    A failure is restarted when fewer than `attempts` restarts were made in the `window` seconds
    before it; the restart is then remembered at the failure's time. A restart leaves the window
    `window` seconds after its failure.
    """

    def __init__(
        self, attempts: int, window: float, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.attempts = attempts
        self.window = window
        self._clock = clock
        self._made: deque[float] = deque()
        self.total = 0

    def _in_window(self, now: float) -> int:
        if self.window > 0:
            while self._made and self._made[0] <= now - self.window:
                self._made.popleft()
        return len(self._made)

    def left(self) -> int:
        """Restarts left in the window as of now."""
        return max(0, self.attempts - self._in_window(self._clock()))

    def made(self) -> int:
        """Restarts made in the window as of now (over the whole life with window 0)."""
        return self._in_window(self._clock())

    def take(self) -> bool:
        """Spend one restart on a failure now; False when none is left (the job stops)."""
        now = self._clock()
        if self._in_window(now) >= self.attempts:
            return False
        self._made.append(now)
        self.total += 1
        return True

    def describe(self) -> str:
        """The budget's setting, for log lines."""
        within = f"within {self.window:g}s" if self.window > 0 else "over the job's life"
        return f"job.restart_attempts = {self.attempts} {within}, job.restart_window_seconds"
