"""The combiner, pure: raw access records in, one row per (window, client, late) out, and the
records a count leaves out with their reason (runs in the read tasks: source.counting_task)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from ipcount.formats.arrow_parse import OK, ChunkParser, ParsedChunk, malformed_reason
from ipcount.source.arrow_schema import COUNTS_ARROW_SCHEMA, TIMESTAMP

__all__ = [
    "KIND_COUNTED",
    "KIND_HEARTBEAT",
    "KIND_MALFORMED",
    "KIND_FUTURE",
    "KIND_LOST",
    "BatchRules",
    "Combiner",
    "counts_heartbeat",
    "reject_reasons",
]

KIND_COUNTED, KIND_HEARTBEAT, KIND_MALFORMED, KIND_FUTURE = (
    "counted",
    "heartbeat",
    "malformed",
    "future",
)
# A task's tally of offsets deleted before they were read (failOnDataLoss=false): not records.
KIND_LOST = "lost"


@dataclass(frozen=True)
class BatchRules:
    """What a read task needs to judge its records, all from the batch's offset-log entry.

    `future_after_ms`: event times above this are future (None: no bound); `late_before_ms`:
    records of windows ending at or before this are late (None: unknown, never late here);
    `clock_ms`: the batch's time, which the watermark must not pass: a counted record after it
    leaves as a correction of its window and carries this time (None: no bound)."""

    window_ms: int
    max_future_skew_ms: int = 0
    future_after_ms: int | None = None
    late_before_ms: int | None = None
    clock_ms: int | None = None

    def future(self, parsed: ParsedChunk) -> np.ndarray:
        ok = parsed.verdict == OK
        if self.future_after_ms is None:
            return np.zeros(len(parsed), dtype=bool)
        future: np.ndarray = ok & (parsed.event_ms > self.future_after_ms)
        return future

    def future_reason(self) -> str:
        return (
            f"future: event time more than {self.max_future_skew_ms / 1000:g} s ahead of its "
            "batch time"
        )


def _timestamps(ms: np.ndarray | Sequence[int | None]) -> pa.Array:
    # Checked: every event time the parser admits (EVENT_TIME_RANGE, and a window or heartbeat
    # past it) is far inside int64 microseconds (+-292,000 years); an overflow would be a bug here,
    # never a record's doing, and must not pass as a wrapped time.
    arr = pa.array(ms, pa.int64())
    return pc.multiply_checked(arr, 1000).cast(TIMESTAMP)


class Combiner:
    """Partial counts of one read task, chunk by chunk; `result()` merges them into rows, so
    Spark's JVM sees partial counts, not lines (source option output=counts).

    When a record counts (one rule, decided here, per record, from the batch's offset-log entry
    only, so a replayed batch decides the same):
    - it parses (arrow_parse: the access-log module's grammar and rules, at any length, its event
      time within Spark's timestamp range); else it is malformed, with the reason;
    - its event time is at most maxFutureSkewMs after the batch's time (Spark's batchTimestampMs in
      the offset log: what `current_timestamp()` is in that batch); else it is future;
    - it is counted under the window holding its event time; it is *late* when that window ends at
      or before `late_before` (the watermark Spark judges this batch by: the previous batch's,
      i.e. that window's result was already emitted) and then leaves as a correction. A window
      that is still open when its batch is processed counts the record on time.

    A counted row's `event_time` is the newest event time among its records (the carrier a late
    row rides on is `late_before` instead, and a row ahead of the batch's time rides on that
    time, `clock_ms`, and leaves as a correction): Spark's watermark, the maximum over rows, is
    the true maximum event time up to the batch's time, never past it. Malformed and future
    records become one `malformed` / `future` row each per task (their count), for the quality
    metrics.
    """

    def __init__(self, rules: BatchRules, native: bool = True) -> None:
        self.rules = rules
        # native: the compiled prefix scan where it is built (ChunkParser; the same verdicts).
        self.parser = ChunkParser(native=native)
        self._partials: list[pa.Table] = []
        self.malformed = 0
        self.future = 0
        self.lost = 0

    def add(self, values: pa.Array) -> None:
        """Parse and combine one chunk of raw record values."""
        parsed = self.parser.parse(values)
        ok = parsed.verdict == OK
        future = self.rules.future(parsed)
        counted = ok & ~future
        self.malformed += int((~ok).sum())
        self.future += int(future.sum())
        if not counted.any():
            return
        event = parsed.event_ms[counted]
        w = self.rules.window_ms
        start = event - np.mod(event, w)
        late_before = self.rules.late_before_ms
        late = (
            start + w <= late_before
            if late_before is not None
            else np.zeros(len(start), dtype=bool)
        )
        clock = self.rules.clock_ms
        if clock is not None:
            # Ahead of the batch's clock (within the skew): counted under its own window, but
            # its carrier is the clock, so the watermark cannot run ahead of it; its window has
            # no result yet when the carrier's window closes, so it leaves as a correction.
            ahead = event > clock
            if ahead.any():
                late = late | ahead
                event = np.where(ahead, clock, event)
        table = pa.table(
            {
                "w": start,
                "ip": parsed.ip_index[counted],
                "late": late,
                "ev": event,
                "n": np.ones(len(start), dtype=np.int64),
            }
        )
        self._partials.append(_group(table))

    def result(self) -> pa.RecordBatch:
        """The task's rows: one per (window, client, late), in key order, then the malformed and
        future tallies (rows only when non-zero)."""
        batches = []
        if self._partials:
            order = [("w", "ascending"), ("ip", "ascending"), ("late", "ascending")]
            rows = _group(pa.concat_tables(self._partials)).sort_by(order)
            n = rows.num_rows
            # Client indices follow first appearance in the task; sorting by them is still a
            # replay-stable order (the same records in the same order give the same indices).
            ips = pa.array(self.parser.ips, pa.string()).take(rows["ip"].combine_chunks())
            late = rows["late"].combine_chunks()
            newest = rows["ev"].combine_chunks()
            late_before = self.rules.late_before_ms
            if late_before is not None:
                # A row of an emitted window rides on late_before; one ahead of the clock on
                # the clock (its `ev`).
                ended = pc.less_equal(
                    pc.add(rows["w"].combine_chunks(), self.rules.window_ms), late_before
                )
                carrier = pc.if_else(
                    pc.and_(late, ended), pa.scalar(late_before, pa.int64()), newest
                )
            else:
                carrier = newest
            batches.append(
                pa.RecordBatch.from_arrays(
                    [
                        pa.repeat(pa.scalar(KIND_COUNTED), n),
                        _timestamps(rows["w"].combine_chunks()),
                        ips,
                        rows["n"].combine_chunks(),
                        _timestamps(carrier),
                        late,
                    ],
                    schema=COUNTS_ARROW_SCHEMA,
                )
            )
        tallies = [
            (KIND_MALFORMED, self.malformed),
            (KIND_FUTURE, self.future),
            (KIND_LOST, self.lost),
        ]
        batches.extend(_single_row(kind, n) for kind, n in tallies if n)
        if not batches:
            return pa.RecordBatch.from_pylist([], schema=COUNTS_ARROW_SCHEMA)
        table = pa.Table.from_batches(batches, schema=COUNTS_ARROW_SCHEMA).combine_chunks()
        return table.to_batches()[0]


def _group(table: pa.Table) -> pa.Table:
    out = table.group_by(["w", "ip", "late"], use_threads=False).aggregate(
        [("ev", "max"), ("n", "sum")]
    )
    return pa.table(
        {
            "w": out["w"],
            "ip": out["ip"],
            "late": out["late"],
            "ev": out["ev_max"],
            "n": out["n_sum"],
        }
    )


def _single_row(kind: str, count: int, event_ms: int | None = None) -> pa.RecordBatch:
    """A row that counts for no window: a task's tally of one kind, or a heartbeat."""
    return pa.RecordBatch.from_arrays(
        [
            pa.array([kind]),
            pa.nulls(1, TIMESTAMP),
            pa.nulls(1, pa.string()),
            pa.array([count], pa.int64()),
            _timestamps([event_ms]),
            pa.array([False]),
        ],
        schema=COUNTS_ARROW_SCHEMA,
    )


def counts_heartbeat(ts_ms: int) -> pa.RecordBatch:
    """The heartbeat row of output=counts: no count, only an event time for the watermark."""
    return _single_row(KIND_HEARTBEAT, 0, ts_ms)


def reject_reasons(parsed: ParsedChunk, rules: BatchRules) -> tuple[np.ndarray, list[str]]:
    """The records of a parsed chunk that are not counted (malformed or future: exactly the ones
    `Combiner` leaves out), as (their indices, their dead-letter reasons)."""
    future = rules.future(parsed)
    index = np.flatnonzero((parsed.verdict != OK) | future)
    reasons = [
        rules.future_reason() if future[i] else malformed_reason(int(parsed.verdict[i]))
        for i in index
    ]
    return index, reasons
