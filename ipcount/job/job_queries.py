"""The running queries of one job (the counting query and the dead-letter query beside it), and
when the dead-letter query starts."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from ipcount.observe.progress import summarize_progress

if TYPE_CHECKING:
    from pyspark.sql.streaming import StreamingQuery

__all__ = ["DEAD_LETTER_START_SECONDS", "JobQueries"]

# A live run's dead-letter query starts once the counting query has caught up with its source
# or this long after that query's first micro-batch (a source it never catches up with).
DEAD_LETTER_START_SECONDS = 30.0


@dataclass
class JobQueries:
    """The running queries of one job: the counts query and, when enabled, the dead-letter query.

    The dead-letter query judges records by the counting query's batches, so it is `pending`
    until `advance()` sees the counting query end (AvailableNow: only then has that query planned
    its last batch) or, in a live run (`live`), catch up with its source: a micro-batch that read
    no new records, or a micro-batch after its first that left nothing behind (lag 0; the first
    batch's watermark is applied by the one after it), or DEAD_LETTER_START_SECONDS after its
    first micro-batch if neither comes. Its start-up (a sink history check, its own Python
    planner and writer processes, ~2 CPU-s) then no longer competes with the counting query's
    first batches, which carry a backlog's results; it has nothing to follow before them anyway,
    and it catches up with them at once (their clean ranges cost it no reads)."""

    counts: StreamingQuery
    dead_letter: StreamingQuery | None = None
    pending: Callable[[], StreamingQuery] | None = None
    live: bool = False
    first_batch_at: float | None = None
    # Why the dead-letter query was started (for the log): what the counting query had done.
    started_because: str = ""

    def all(self) -> list[StreamingQuery]:
        return [q for q in (self.counts, self.dead_letter) if q is not None]

    def advance(self, now: float | None = None) -> bool:
        """Start the pending dead-letter query once the counting query ended cleanly (or, `live`,
        caught up while running); True when it was started. `now`: time.monotonic()."""
        if self.pending is None:
            return False
        if self.live:
            progress = self.counts.lastProgress
            if not self.counts.isActive or progress is None:
                return False
            now = time.monotonic() if now is None else now
            if self.first_batch_at is None:
                self.first_batch_at = now
            # lastProgress holds Rows where summarize_progress reads JSON: go through its JSON.
            done = summarize_progress(json.loads(progress.json))
            caught_up = done["records"] == 0 or (done["lag"] == 0 and (done["batch"] or 0) >= 1)
            if not caught_up and now - self.first_batch_at < DEAD_LETTER_START_SECONDS:
                return False
            self.started_because = (
                "caught up with its source"
                if caught_up
                else f"has run {DEAD_LETTER_START_SECONDS:g} s without catching up"
            )
        elif self.counts.isActive or self.counts.exception() is not None:
            return False
        else:
            self.started_because = "is done"
        start, self.pending = self.pending, None
        self.dead_letter = start()
        return True

    def await_available_now(self, timeout: int) -> None:
        """Wait for an AvailableNow run to end: the counting query, then the dead-letter query."""
        self.counts.awaitTermination(timeout)
        self.advance()
        if self.dead_letter is not None:
            self.dead_letter.awaitTermination(timeout)
