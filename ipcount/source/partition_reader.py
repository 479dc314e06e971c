"""Executor-side reads of the source: one offset range of a partition as Arrow batches, and the
heartbeat row."""

from __future__ import annotations

import logging
import operator
import time
from collections.abc import Callable, Iterable, Iterator
from functools import partial
from typing import TypeVar, cast

import numpy as np
import pyarrow as pa
from confluent_kafka import (
    Consumer,
    KafkaError,
    KafkaException,
    Message,
    TopicPartition,
)

from ipcount.errors import SourceError
from ipcount.kafka.client import describe_kafka_error
from ipcount.source.arrow_schema import RECORDS_ARROW_SCHEMA, TIMESTAMP
from ipcount.source.consumer import CONSUME_TIMEOUT_S, DRIVER_TIMEOUT_S, new_consumer, offset_of
from ipcount.source.data_loss import lost_offsets
from ipcount.source.offsets import OffsetRange
from ipcount.source.options import SourceOptions
from ipcount.worker_gc import gc_paused

__all__ = [
    "BATCH_ROWS",
    "MAX_BINARY_BYTES",
    "read_range",
    "read_messages",
    "read_chunks",
    "records_batch",
    "heartbeat_batch",
    "message_values",
    "values_array",
    "chunk_values",
    "chunk_bounds",
    "follow_position",
    "after_read_error",
    "ReadState",
]

logger = logging.getLogger(__name__)

# Rows per Arrow batch handed to Spark: large batches amortize the Python/JVM hand-over.
BATCH_ROWS = 50_000
_DATA_LOSS_CODES = {KafkaError._AUTO_OFFSET_RESET, KafkaError.OFFSET_OUT_OF_RANGE}
# The largest data buffer a binary array's int32 offsets address.
MAX_BINARY_BYTES = 2**31 - 1
_not_none = partial(operator.is_not, None)
_T = TypeVar("_T")


def _late_before(n: int, late_before_ms: int | None) -> pa.Array:
    if late_before_ms is None:
        return pa.nulls(n, TIMESTAMP)
    return pa.repeat(pa.scalar(late_before_ms * 1000, TIMESTAMP), n)


def heartbeat_batch(topic: str, ts_ms: int, late_before_ms: int | None = None) -> pa.RecordBatch:
    """The one heartbeat row: key/value null, partition/offset/timestampType -1, heartbeat true."""
    return pa.RecordBatch.from_arrays(
        [
            pa.nulls(1, pa.binary()),
            pa.nulls(1, pa.binary()),
            pa.array([topic], pa.string()),
            pa.array([-1], pa.int32()),
            pa.array([-1], pa.int64()),
            pa.array([ts_ms * 1000], pa.int64()).cast(TIMESTAMP),
            pa.array([-1], pa.int32()),
            pa.array([True], pa.bool_()),
            _late_before(1, late_before_ms),
        ],
        schema=RECORDS_ARROW_SCHEMA,
    )


def records_batch(
    msgs: list[Message], topic: str, partition: int, late_before_ms: int | None = None
) -> pa.RecordBatch:
    """Records of one partition as a batch of the source schema (output=records)."""
    n = len(msgs)
    # One (type, ms) pair per record; numpy converts the list of tuples in C.
    stamps = np.array([m.timestamp() for m in msgs], dtype=np.int64).reshape(n, 2)
    # librdkafka: 0 = not available, 1 = CreateTime, 2 = LogAppendTime; Kafka/Spark: -1, 0, 1.
    types = stamps[:, 0].astype(np.int32)
    missing = types == 0
    micros = pa.array(stamps[:, 1] * 1000, mask=missing if missing.any() else None)
    return pa.RecordBatch.from_arrays(
        [
            pa.array([m.key() for m in msgs], pa.binary()),
            pa.array([m.value() for m in msgs], pa.binary()),
            pa.repeat(pa.scalar(topic, pa.string()), n),
            pa.repeat(pa.scalar(partition, pa.int32()), n),
            pa.array([m.offset() for m in msgs], pa.int64()),
            micros.cast(TIMESTAMP),
            pa.array(types - 1),
            pa.repeat(pa.scalar(False), n),
            _late_before(n, late_before_ms),
        ],
        schema=RECORDS_ARROW_SCHEMA,
    )


def read_range(
    options: SourceOptions,
    rng: OffsetRange,
    batch_rows: int = BATCH_ROWS,
    late_before_ms: int | None = None,
) -> Iterator[pa.RecordBatch]:
    """Read offsets [rng.start, rng.end) of one partition as Arrow batches (executor side).

    Every row carries `late_before_ms` (the batch's watermark for late records; None: unknown).
    See read_messages for how the range is read and what raises.
    """
    for msgs in read_messages(options, rng, batch_rows):
        yield records_batch(msgs, rng.topic, rng.partition, late_before_ms)


def read_messages(
    options: SourceOptions,
    rng: OffsetRange,
    batch_rows: int = BATCH_ROWS,
    on_lost: Callable[[int], None] | None = None,
) -> Iterator[list[Message]]:
    """Read offsets [rng.start, rng.end) of one partition as chunks of Message objects: see
    read_chunks, which this is without a conversion."""
    return read_chunks(options, rng, _as_messages, batch_rows, on_lost)


def _as_messages(msgs: list[Message]) -> list[Message]:
    return msgs


def read_chunks(
    options: SourceOptions,
    rng: OffsetRange,
    convert: Callable[[list[Message]], _T],
    batch_rows: int = BATCH_ROWS,
    on_lost: Callable[[int], None] | None = None,
) -> Iterator[_T]:
    """Read offsets [rng.start, rng.end) of one partition in chunks of at most `batch_rows`
    records and options.max_bytes_per_batch value bytes (a larger record: a chunk alone); each
    chunk as `convert` turns it (e.g. `chunk_values`).

    Reads until the consumer's position reaches rng.end: control records and aborted records
    occupy offsets but are never returned, so counting records would wait forever. Offsets of
    the range deleted before they were read (failOnDataLoss=false) are skipped, logged, and
    their number handed to `on_lost`.

    Raises:
        DataLossError: offsets of the range were deleted, with failOnDataLoss=true.
        SourceError: a Kafka error, or no progress within kafkaConsumer.pollTimeoutMs; always
            naming topic, partition and offsets.
    """
    consumer = new_consumer(options.consumer_conf("executor"))
    try:
        state = ReadState(rng.start, on_lost)
        consumer.assign([TopicPartition(rng.topic, rng.partition, rng.start)])
        while state.pos < rng.end:
            # Message objects are GC-tracked: no collections while a batch of them is built, nor
            # while `convert` turns it into what the caller keeps; then they are freed before the
            # collector resumes, which never walks them (it did: 0.25 us per record).
            with gc_paused():
                chunks = [
                    convert(chunk)
                    for chunk in _next_batch(consumer, options, rng, batch_rows, state)
                ]
            yield from chunks
    finally:
        consumer.close()


def message_values(msgs: list[Message]) -> list[bytes | None]:
    """Each message's value (None: no value), in one C-level pass."""
    return list(map(Message.value, msgs))


def values_array(values: list[bytes | None]) -> pa.Array:
    """Values as one Arrow binary array (null for None): its data buffer one join of the values
    and its offsets their lengths' running sums, instead of Arrow visiting each object (0.33 ->
    0.13 us per record on consumed messages, `ipcount bench costs`)."""
    n = len(values)
    if not n or values.count(None):
        return pa.array(values, pa.binary())
    present = cast(list[bytes], values)  # no None among them
    offsets = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(np.fromiter(map(len, present), dtype=np.int64, count=n), out=offsets[1:])
    if offsets[-1] > MAX_BINARY_BYTES:
        return pa.array(values, pa.binary())
    buffers = [None, pa.py_buffer(offsets.astype(np.int32)), pa.py_buffer(b"".join(present))]
    return pa.Array.from_buffers(pa.binary(), n, buffers)


def chunk_values(msgs: list[Message]) -> pa.Array:
    """A chunk's values as an Arrow binary array: `read_chunks`' convert for the counting."""
    return values_array(message_values(msgs))


class ReadState:
    """Where a range read stands: the next offset, and when it last moved."""

    __slots__ = ("pos", "last_progress", "on_lost")

    def __init__(self, pos: int, on_lost: Callable[[int], None] | None = None) -> None:
        self.pos = pos
        self.last_progress = time.monotonic()
        self.on_lost = on_lost


def chunk_bounds(sizes: Iterable[int], count: int, max_bytes: int, total: int) -> list[slice]:
    """Where `count` records of `sizes` value bytes (`total` in all) are cut into chunks of at most
    `max_bytes` value bytes each (a larger record: a chunk alone)."""
    if not count:
        return []
    if total <= max_bytes:
        return [slice(0, count)]
    out: list[slice] = []
    first, size = 0, 0
    for i, n in enumerate(sizes):
        if size + n > max_bytes and i > first:
            out.append(slice(first, i))
            first, size = i, 0
        size += n
    if first < count:
        out.append(slice(first, count))
    return out


def _chunks(msgs: list[Message], max_bytes: int, total: int) -> list[list[Message]]:
    """`msgs` in chunks of at most `max_bytes` value bytes each; `total`: their value bytes."""
    # len(Message) is its value's size.
    return [msgs[cut] for cut in chunk_bounds(map(len, msgs), len(msgs), max_bytes, total)]


def follow_position(
    consumer: Consumer, options: SourceOptions, rng: OffsetRange, st: ReadState
) -> None:
    """After a consume call: move `st` to the consumer's position when it passed offsets that
    return nothing (control records, aborted transactions), or fail once the read has made no
    progress for kafkaConsumer.pollTimeoutMs."""
    now_pos = consumer.position([TopicPartition(rng.topic, rng.partition)])[0].offset
    if now_pos > st.pos:
        st.pos = now_pos
        st.last_progress = time.monotonic()
    elif time.monotonic() - st.last_progress > options.poll_timeout_ms / 1000:
        raise SourceError(
            f"no progress reading {rng.topic}/{rng.partition} for {options.poll_timeout_ms} ms "
            f"(kafkaConsumer.pollTimeoutMs): at offset {st.pos}, reading up to {rng.end}"
        )


def after_read_error(
    consumer: Consumer, options: SourceOptions, rng: OffsetRange, st: ReadState, err: KafkaError
) -> None:
    """An error event at `st.pos`: go on where it says (the rest of the range deleted: the read is
    done, st.pos reaches the end), or raise."""
    restart, lost = _handle_read_error(consumer, options, rng, st.pos, err)
    if lost and st.on_lost is not None:
        st.on_lost(lost)
    st.pos = restart
    st.last_progress = time.monotonic()


def _next_batch(
    consumer: Consumer, options: SourceOptions, rng: OffsetRange, batch_rows: int, st: ReadState
) -> list[list[Message]]:
    """Consume until `batch_rows` records or options.max_bytes_per_batch value bytes are pending,
    or the range ends; return them in chunks of at most that many bytes each (none when the range
    ended empty). Bytes bound a chunk's memory: 50,000 records of 900 KB are 45 GB.

    Raises:
        SourceError: as read_messages.
    """
    end = rng.end
    pending: list[Message] = []
    pending_bytes = 0
    max_bytes = options.max_bytes_per_batch
    while st.pos < end:
        msgs = consumer.consume(
            max(1, min(batch_rows - len(pending), end - st.pos)), CONSUME_TIMEOUT_S
        )
        if msgs:
            # One C-level pass for the common case, no error (KafkaError == None raises, so no
            # list.count(None) here); then where the first one is.
            if any(map(_not_none, map(Message.error, msgs))):
                failed = next(i for i, m in enumerate(msgs) if m.error() is not None)
                # Records before the error are valid; the error decides where to go on.
                good = [m for m in msgs[:failed] if offset_of(m) < end]
                pending.extend(good)
                pending_bytes += sum(map(len, good))
                if good:
                    st.pos = offset_of(good[-1]) + 1
                after_read_error(consumer, options, rng, st, cast(KafkaError, msgs[failed].error()))
                continue
            if offset_of(msgs[-1]) >= end:
                msgs = [m for m in msgs if offset_of(m) < end]
            if msgs:
                pending.extend(msgs)
                pending_bytes += sum(map(len, msgs))  # len(Message) is its value's size
                st.pos = max(st.pos, offset_of(msgs[-1]) + 1)
                st.last_progress = time.monotonic()
            if len(pending) >= batch_rows or pending_bytes >= max_bytes:
                return _chunks(pending, max_bytes, pending_bytes)
        follow_position(consumer, options, rng, st)
    return _chunks(pending, max_bytes, pending_bytes)


def _handle_read_error(
    consumer: Consumer, options: SourceOptions, rng: OffsetRange, pos: int, err: KafkaError
) -> tuple[int, int]:
    """Handle a consume error at `pos`: (the offset to continue from, rng.end when the rest of
    the range is gone; how many offsets were lost), or raise."""
    where = f"{rng.topic}/{rng.partition}"
    if err.code() not in _DATA_LOSS_CODES:
        raise SourceError(
            f"reading {where} at offset {pos} (range {rng.start}-{rng.end}): "
            f"{describe_kafka_error(err)}"
        ) from KafkaException(err)
    try:
        low, high = consumer.get_watermark_offsets(
            TopicPartition(rng.topic, rng.partition), timeout=DRIVER_TIMEOUT_S, cached=False
        )
    except KafkaException as exc:
        raise SourceError(
            f"reading {where}: offset {pos} is out of range and the log bounds are unknown: "
            f"{describe_kafka_error(exc)}"
        ) from exc
    if pos < low:
        resume = min(low, rng.end)
        detail = f"were deleted before they were read (log now starts at {low})"
    else:
        resume = rng.end
        detail = f"are beyond the end of the log ({high}); was the topic deleted and re-created?"
    lost_offsets(
        options.fail_on_data_loss,
        f"partition {where}: offsets {pos}-{resume - 1} {detail} (read task {rng.start}-"
        f"{rng.end}; {resume - pos} offsets)",
    )
    if resume < rng.end:
        consumer.assign([TopicPartition(rng.topic, rng.partition, resume)])
    return resume, resume - pos
