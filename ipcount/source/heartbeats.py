"""The heartbeats the driver adds to a batch's end offset (driver only): idle heartbeats, so the
watermark moves when input stops, and the AvailableNow run's two flush heartbeats. What they
decide lives in the offset, so a replayed batch yields the same rows."""

from __future__ import annotations

import time
from typing import Any

from ipcount.source.offsets import (
    Heartbeat,
    SourceOffset,
    TopicPartitionKey,
    flush_heartbeat,
    next_heartbeat,
)
from ipcount.source.options import SourceOptions

__all__ = ["HeartbeatPlanner"]


class HeartbeatPlanner:
    """Plans heartbeats for one stream reader; `offsets` is its KafkaOffsetReader (asked for the
    newest event time of the last records read)."""

    def __init__(self, options: SourceOptions, offsets: Any) -> None:
        self.options = options
        self._offsets = offsets
        self._idle_since: float | None = None
        self._base_cache: tuple[tuple[tuple[TopicPartitionKey, int], ...], int | None] | None = None

    def records_read(self) -> None:
        """A batch with records was planned: idleness starts again at the first plan after it that
        finds no new records. (Counting it from this plan instead made the batch after a long
        one, which Spark runs anyway to apply the watermark that batch moved, carry a heartbeat
        and pay the newest-event-time lookup: ~0.6 s on the path to a backlog's last results.)"""
        self._idle_since = None

    def final_flush(
        self,
        end: dict[TopicPartitionKey, int],
        available: dict[TopicPartitionKey, int],
        available_now: bool,
    ) -> Heartbeat | None:
        """The first flush heartbeat, carried by the data batch that completes an AvailableNow run
        (availableNowFlush=data: it is at a time the data batch does not change).

        Riding on the last data batch saves a whole micro-batch (~1-3 s) per run: that batch moves
        the watermark to the newest event time, and the one heartbeat batch after it emits the
        windows that closed.
        """
        if not available_now or not self.options.heartbeats or end != available:
            return None
        if self.options.available_now_flush == "all":
            return None  # the closing time needs the data batch's watermark: see _closing_flush
        return self._flush(None, end)

    def next(
        self, begin: SourceOffset, latest: dict[TopicPartitionKey, int], available_now: bool
    ) -> Heartbeat | None:
        """The heartbeat of a batch that reads no records, or None (no batch)."""
        prev = begin.heartbeat
        opts = self.options
        # The last records are read below the stable end (an open transaction may hold it back).
        tail = {tp: min(off, latest.get(tp, 0)) for tp, off in begin.offsets.items()}
        if available_now:
            return self._flush(prev, tail)
        now = time.monotonic()
        if self._idle_since is None:
            # A restarted driver continues the idle time the last heartbeat stood for.
            self._idle_since = now - ((prev.ts - prev.base) / 1000 if prev is not None else 0.0)
        idle_ms = int((now - self._idle_since) * 1000)
        if idle_ms < opts.idle_timeout_ms:
            return None
        base = prev.base if prev is not None else self._latest_event_ms(tail)
        if base is None:
            return None
        return next_heartbeat(
            prev,
            base,
            idle_ms,
            idle_timeout_ms=opts.idle_timeout_ms,
            max_advance_ms=opts.heartbeat_max_advance_ms,
            interval_ms=opts.heartbeat_interval_ms,
        )

    def _flush(
        self, prev: Heartbeat | None, tail: dict[TopicPartitionKey, int]
    ) -> Heartbeat | None:
        """AvailableNow's next flush heartbeat after `prev`, based on the last record below `tail`
        (or prev's base); None once both were sent or when there are no records."""
        if self.options.available_now_flush == "all":
            return self._closing_flush(prev, tail)
        base = prev.base if prev is not None else self._latest_event_ms(tail)
        if base is None:
            return None
        # End at the newest event time: later runs lose nothing.
        return flush_heartbeat(prev, base, 0)

    def _closing_flush(
        self, prev: Heartbeat | None, tail: dict[TopicPartitionKey, int]
    ) -> Heartbeat | None:
        """availableNowFlush=all (the input is finished): close exactly the windows that hold
        data. The newest event time counted is the committed watermark plus its delay (read from
        the query's commit log once the data batches are done, so out-of-order tails cannot hide
        a newer one); event time then moves to the end of that time's window plus the delay. No
        wall clock: records of a later run in windows from that end on are on time."""
        newest = self._newest_counted_ms(prev, tail)
        if newest is None:
            return None
        window = self.options.window_ms
        closing = newest - newest % window + window + self.options.watermark_delay_ms
        if prev is None or prev.ts < closing:
            return Heartbeat(seq=prev.seq + 1 if prev is not None else 1, ts=closing, base=newest)
        if prev.ts == closing:  # one more batch, so Spark applies the watermark it moved
            return Heartbeat(seq=prev.seq + 1, ts=closing + 1, base=newest)
        return None

    def _newest_counted_ms(
        self, prev: Heartbeat | None, tail: dict[TopicPartitionKey, int]
    ) -> int | None:
        """The newest event time the query has counted: from the commit log's watermark when the
        records set it, else (a heartbeat set it) that heartbeat's base; the tail's without a
        query checkpoint."""
        tail_ms = self._latest_event_ms(tail)
        committed = None
        if self.options.query_checkpoint:
            from ipcount.checkpoint.offset_log import OffsetLog

            watermark = OffsetLog(self.options.query_checkpoint).committed_watermark_ms()
            if watermark is not None and watermark > 0:
                committed = watermark + self.options.watermark_delay_ms
        if committed is not None and prev is not None and committed <= prev.ts:
            committed = prev.base  # the heartbeat moved the watermark, not a record
        known = [ms for ms in (committed, tail_ms) if ms is not None]
        return max(known) if known else None

    def _latest_event_ms(self, offsets: dict[TopicPartitionKey, int]) -> int | None:
        key = tuple(sorted(offsets.items()))
        if self._base_cache is None or self._base_cache[0] != key:
            # The planning clock bounds the base (future skew); the base is then kept in the offset,
            # so a replayed batch reuses it and never reads the clock again.
            now_ms = int(time.time() * 1000)
            newest = self._offsets.latest_event_ms(offsets, now_ms)
            opts = self.options
            if newest is not None and opts.late_corrections and opts.max_future_skew_ms > 0:
                # Nor past the clock: a record ahead of it (within the skew) is counted with
                # the clock as its carrier (source.combiner), and heartbeats follow suit.
                newest = min(newest, now_ms)
            self._base_cache = (key, newest)
        return self._base_cache[1]
