"""The Spark read task of output=counts and output=rejects (executor): reads its offset range in
chunks and hands Spark the combined counts, or the records those counts leave out."""

from __future__ import annotations

from collections.abc import Iterator, Sequence

import pyarrow as pa

from ipcount.formats.arrow_parse import ChunkParser
from ipcount.source.arrow_schema import REJECTS_ARROW_SCHEMA
from ipcount.source.clean_ranges import future_bound, is_clean, mark_clean, unmark
from ipcount.source.combiner import BatchRules, Combiner, counts_heartbeat, reject_reasons
from ipcount.source.native_reader import read_values
from ipcount.source.offsets import OffsetRange
from ipcount.source.options import SourceOptions
from ipcount.source.partition_reader import chunk_values, read_messages, records_batch

__all__ = ["batch_rules", "read_task"]


def batch_rules(
    options: SourceOptions, late_before_ms: int | None, batch_ms: int | None
) -> BatchRules:
    """The rules a task judges its records by: the source's options plus its batch's offset-log
    entry (late_before, batch time)."""
    skew = options.max_future_skew_ms
    return BatchRules(
        window_ms=options.window_ms,
        max_future_skew_ms=skew,
        future_after_ms=future_bound(batch_ms, skew),
        late_before_ms=late_before_ms,
        # The watermark stays behind the batch's time; a record ahead of it leaves as a
        # correction, so this needs late corrections (without them Spark's rule applies).
        clock_ms=batch_ms if options.late_corrections and skew > 0 else None,
    )


def read_task(
    options: SourceOptions,
    ranges: Sequence[OffsetRange],
    heartbeat_ms: int | None,
    late_before_ms: int | None,
    batch_ms: int | None,
) -> Iterator[pa.RecordBatch]:
    """The rows of one task (a reader.KafkaInputPartition's fields) for options.output counts or
    rejects: its ranges read one after the other."""
    late_before = late_before_ms if options.late_corrections else None
    rules = batch_rules(options, late_before, batch_ms)
    if options.output == "counts":
        if heartbeat_ms is not None:
            yield counts_heartbeat(heartbeat_ms)
        if ranges:
            result = _count(options, ranges, rules)
            if result.num_rows:
                yield result
        return
    for rng in ranges:
        yield from _rejects(options, rng, rules)


def _count(
    options: SourceOptions, ranges: Sequence[OffsetRange], rules: BatchRules
) -> pa.RecordBatch:
    """The partial counts of `ranges` together (one Combiner); each range read whole with
    nothing rejected gets its clean-range marker (a marker of any attempt stays true)."""
    combiner = Combiner(rules, native=options.native_helpers != "off")

    def lost(n: int) -> None:
        combiner.lost += n

    for rng in ranges:
        rejected = combiner.malformed + combiner.future
        for values in read_values(options, rng, on_lost=lost):
            combiner.add(values)
        if options.clean_range_markers and combiner.malformed + combiner.future == rejected:
            # The whole range read, nothing rejected: the dead letters need not read it.
            mark_clean(options.query_checkpoint, rng, rules.future_after_ms)
    return combiner.result()


def _rejects(
    options: SourceOptions, rng: OffsetRange, rules: BatchRules
) -> Iterator[pa.RecordBatch]:
    """The records of `rng` the counting left out, with their reasons (output=rejects)."""
    marked = options.counts_checkpoint
    if marked and is_clean(marked, rng, rules.future_after_ms):
        # The counting query read this exact range with this batch time and rejected nothing.
        unmark(marked, rng, rules.future_after_ms)
        return
    parser = ChunkParser(native=options.native_helpers != "off")
    for msgs in read_messages(options, rng):
        parsed = parser.parse(chunk_values(msgs))
        index, reasons = reject_reasons(parsed, rules)
        if not len(index):
            continue
        raw = records_batch([msgs[i] for i in index.tolist()], rng.topic, rng.partition)
        columns = [raw.column(name) for name in REJECTS_ARROW_SCHEMA.names[:-1]]
        yield pa.RecordBatch.from_arrays(
            [*columns, pa.array(reasons, pa.string())], schema=REJECTS_ARROW_SCHEMA
        )
