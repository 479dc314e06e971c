"""Kafka I/O of the source: metadata and offset lookups (driver), range reads (executors)."""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator, Mapping
from typing import Any, cast

import numpy as np
import pyarrow as pa
from confluent_kafka import (
    Consumer,
    IsolationLevel,
    KafkaError,
    KafkaException,
    Message,
    TopicPartition,
)
from confluent_kafka.admin import AdminClient, OffsetSpec

from ipcount.errors import SourceError
from ipcount.kafka import describe_kafka_error, with_client_logging
from ipcount.source_offsets import OffsetRange, TopicPartitionKey
from ipcount.source_options import SourceOptions
from ipcount.worker_gc import gc_paused

__all__ = ["ARROW_SCHEMA", "KafkaOffsetReader", "read_range", "heartbeat_batch"]

logger = logging.getLogger(__name__)

# Must equal Spark's Arrow form of the source schema exactly (checked by Spark on the first batch).
ARROW_SCHEMA = pa.schema(
    [
        pa.field("key", pa.binary()),
        pa.field("value", pa.binary()),
        pa.field("topic", pa.string()),
        pa.field("partition", pa.int32()),
        pa.field("offset", pa.int64()),
        pa.field("timestamp", pa.timestamp("us", tz="UTC")),
        pa.field("timestampType", pa.int32()),
        pa.field("heartbeat", pa.bool_()),
    ]
)

# Rows per Arrow batch handed to Spark: large batches amortize the Python/JVM hand-over.
BATCH_ROWS = 50_000
# How long one consume() call waits; short, because a range's last offsets may be control
# records that never arrive as messages (the position still moves past them).
_CONSUME_TIMEOUT_S = 0.1
# Driver lookups (metadata, offsets, tail reads) give up after this long.
_DRIVER_TIMEOUT_S = 30.0
# Driver tail reads look at the last N offsets per partition first, widening N by x16 when the
# window holds no data record (only control or aborted records).
_TAIL_WINDOW = 16
_TAIL_ATTEMPTS = 4
_TAIL_TIMEOUT_S = 10.0
_RETRIABLE_METADATA = {
    KafkaError.LEADER_NOT_AVAILABLE,
    KafkaError.NOT_LEADER_FOR_PARTITION,
    KafkaError._TRANSPORT,
    KafkaError._TIMED_OUT,
    KafkaError.REQUEST_TIMED_OUT,
}
_DATA_LOSS_CODES = {KafkaError._AUTO_OFFSET_RESET, KafkaError.OFFSET_OUT_OF_RANGE}


class KafkaOffsetReader:
    """Driver-side lookups: partitions, earliest/latest offsets and the latest record event time.

    Clients are created on first use (this object lives in Spark's Python source process) and
    closed by `close()`. Metadata comes from a consumer with allow.auto.create.topics=false, so a
    missing topic is reported instead of being created by brokers with auto-creation on.
    """

    def __init__(self, options: SourceOptions) -> None:
        self._options = options
        self._consumer: Consumer | None = None
        self._admin: AdminClient | None = None

    def __getstate__(self) -> dict[str, Any]:
        return {"_options": self._options, "_consumer": None, "_admin": None}

    def _get_consumer(self) -> Consumer:
        if self._consumer is None:
            self._consumer = _new_consumer(self._options.consumer_conf("driver"))
        return self._consumer

    def _get_admin(self) -> AdminClient:
        if self._admin is None:
            try:
                self._admin = AdminClient(with_client_logging(self._options.admin_conf()))
            except KafkaException as exc:
                raise SourceError(
                    f"cannot create the Kafka admin client: {describe_kafka_error(exc)}"
                ) from exc
        return self._admin

    def close(self) -> None:
        """Close the clients (idempotent)."""
        if self._consumer is not None:
            try:
                self._consumer.close()
            except (KafkaException, RuntimeError) as exc:
                logger.debug("closing the driver consumer: %s", describe_kafka_error(exc))
            self._consumer = None
        self._admin = None

    def partitions(self) -> list[TopicPartitionKey]:
        """All partitions of the subscribed topics, sorted.

        Raises:
            SourceError: a topic does not exist, or metadata stays unavailable.
        """
        consumer = self._get_consumer()
        result: list[TopicPartitionKey] = []
        for topic in self._options.topics:
            deadline = time.monotonic() + _DRIVER_TIMEOUT_S
            while True:
                try:
                    md = consumer.list_topics(topic, timeout=max(0.1, deadline - time.monotonic()))
                    tmd = md.topics.get(topic)
                    err = tmd.error if tmd is not None else None
                except KafkaException as exc:
                    err = exc.args[0] if exc.args else exc
                    tmd = None
                if err is None and tmd is not None and tmd.partitions:
                    break
                code = err.code() if isinstance(err, KafkaError) else None
                if code in (KafkaError.UNKNOWN_TOPIC_OR_PART, KafkaError._UNKNOWN_TOPIC):
                    raise SourceError(
                        f"topic {topic!r} (option subscribe) does not exist on "
                        f"{self._options.kafka.get('bootstrap.servers')}; create it first "
                        "(`ipcount topics create`), the source never creates topics"
                    )
                if time.monotonic() >= deadline or (
                    err is not None and code not in _RETRIABLE_METADATA
                ):
                    detail = describe_kafka_error(err) if err is not None else "no partitions"
                    raise SourceError(f"cannot read metadata of topic {topic!r}: {detail}")
                time.sleep(0.2)
            result.extend((topic, p) for p in tmd.partitions)
        return sorted(result)

    def offsets(
        self, partitions: list[TopicPartitionKey], which: str, read_committed: bool | None = None
    ) -> dict[TopicPartitionKey, int]:
        """Earliest or latest offsets ('earliest'/'latest'); latest is the LSO under read_committed.

        Args:
            partitions: the topic partitions to look up.
            which: 'earliest' or 'latest'.
            read_committed: isolation of the lookup; None uses kafka.isolation.level.

        Raises:
            SourceError: naming the topic partition whose lookup failed.
        """
        if not partitions:
            return {}
        spec = OffsetSpec.earliest() if which == "earliest" else OffsetSpec.latest()
        committed = self._options.read_committed if read_committed is None else read_committed
        isolation = IsolationLevel.READ_COMMITTED if committed else IsolationLevel.READ_UNCOMMITTED
        request = {TopicPartition(t, p): spec for t, p in partitions}
        try:
            futures = self._get_admin().list_offsets(
                request, isolation_level=isolation, request_timeout=_DRIVER_TIMEOUT_S
            )
        except KafkaException as exc:
            raise SourceError(
                f"cannot look up {which} offsets: {describe_kafka_error(exc)}"
            ) from exc
        result: dict[TopicPartitionKey, int] = {}
        for tp, fut in futures.items():
            try:
                result[(tp.topic, tp.partition)] = int(
                    fut.result(timeout=_DRIVER_TIMEOUT_S + 5).offset
                )
            except KafkaException as exc:
                raise SourceError(
                    f"cannot look up the {which} offset of {tp.topic}/{tp.partition}: "
                    f"{describe_kafka_error(exc)}"
                ) from exc
        return result

    def max_timestamps(self, ends: Mapping[TopicPartitionKey, int]) -> dict[TopicPartitionKey, int]:
        """Each partition's largest record timestamp, where that record lies before its end.

        ListOffsets with MAX_TIMESTAMP (KIP-734, Kafka 3.0+) names the record with the largest
        timestamp in the whole partition. When that record is below `ends` it is also the largest
        among the records read so far: exact even for out-of-order event times. Partitions where it
        lies beyond `ends`, or brokers that do not support the lookup, are left out.
        """
        request = {
            TopicPartition(t, p): OffsetSpec.max_timestamp() for (t, p), e in ends.items() if e > 0
        }
        if not request:
            return {}
        out: dict[TopicPartitionKey, int] = {}
        try:
            futures = self._get_admin().list_offsets(request, request_timeout=_DRIVER_TIMEOUT_S)
            for tp, fut in futures.items():
                info = fut.result(timeout=_DRIVER_TIMEOUT_S + 5)
                key = (tp.topic, tp.partition)
                if 0 <= info.offset < ends[key] and info.timestamp >= 0:
                    out[key] = int(info.timestamp)
        except KafkaException as exc:
            logger.debug(
                "MAX_TIMESTAMP lookup failed, scanning tails: %s", describe_kafka_error(exc)
            )
            return {}
        return out

    def latest_event_ms(self, ends: Mapping[TopicPartitionKey, int]) -> int | None:
        """The largest record timestamp (epoch ms) among the records before `ends`, or None.

        Uses the broker's MAX_TIMESTAMP lookup where it answers for the range read; otherwise reads
        a small window before each end offset (the last records: a lower bound when event times
        arrive out of order), widening it while it holds only control or aborted records. Used for
        heartbeat event times when the source is idle.
        """
        exact = self.max_timestamps(ends)
        best: int | None = max(exact.values()) if exact else None
        pending = {tp: end for tp, end in ends.items() if end > 0 and tp not in exact}
        window = _TAIL_WINDOW
        consumer = self._get_consumer()
        for _ in range(_TAIL_ATTEMPTS):
            if not pending:
                break
            starts = {tp: max(0, end - window) for tp, end in pending.items()}
            consumer.assign([TopicPartition(t, p, starts[(t, p)]) for t, p in pending])
            try:
                found = self._drain_tail(consumer, pending)
            finally:
                # An assigned, caught-up consumer would poll noida-db in a tight loop.
                consumer.unassign()
            for tp, ts in found.items():
                best = ts if best is None else max(best, ts)
            # Done with partitions that had a data record, or whose whole log was scanned.
            pending = {tp: e for tp, e in pending.items() if tp not in found and starts[tp] > 0}
            window *= 16
        return best

    def _drain_tail(
        self, consumer: Consumer, ends: Mapping[TopicPartitionKey, int]
    ) -> dict[TopicPartitionKey, int]:
        found: dict[TopicPartitionKey, int] = {}
        tps = [TopicPartition(t, p) for t, p in ends]
        deadline = time.monotonic() + _TAIL_TIMEOUT_S
        while time.monotonic() < deadline:
            for msg in consumer.consume(1000, _CONSUME_TIMEOUT_S):
                err = msg.error()
                if err is not None:
                    if err.code() == KafkaError._PARTITION_EOF:
                        continue
                    raise SourceError(
                        f"reading the last records of {msg.topic()}/{msg.partition()}: "
                        f"{describe_kafka_error(err)}"
                    )
                tp = (cast(str, msg.topic()), cast(int, msg.partition()))
                ts_type, ts = msg.timestamp()
                if _offset(msg) < ends[tp] and ts_type != 0:
                    found[tp] = max(found.get(tp, ts), ts)
            positions = consumer.position(tps)
            if all(pos.offset >= ends[(pos.topic, pos.partition)] for pos in positions):
                return found
        # Heartbeats are best effort: go on with what was found rather than fail the query.
        logger.warning(
            "timed out after %gs reading the last records of %s; heartbeat time may lag",
            _TAIL_TIMEOUT_S,
            sorted(ends),
        )
        return found


def _offset(msg: Message) -> int:
    # Only data messages reach here; their offset is always set.
    return cast(int, msg.offset())


def _new_consumer(conf: Mapping[str, str]) -> Consumer:
    try:
        return Consumer(with_client_logging(conf, "ipcount.source.librdkafka"))
    except KafkaException as exc:
        raise SourceError(
            "cannot create the Kafka consumer (check the kafka.* options): "
            f"{describe_kafka_error(exc)}"
        ) from exc


def heartbeat_batch(topic: str, ts_ms: int) -> pa.RecordBatch:
    """The one heartbeat row: key/value null, partition/offset/timestampType -1, heartbeat true."""
    return pa.RecordBatch.from_arrays(
        [
            pa.nulls(1, pa.binary()),
            pa.nulls(1, pa.binary()),
            pa.array([topic], pa.string()),
            pa.array([-1], pa.int32()),
            pa.array([-1], pa.int64()),
            pa.array([ts_ms * 1000], pa.int64()).cast(pa.timestamp("us", tz="UTC")),
            pa.array([-1], pa.int32()),
            pa.array([True], pa.bool_()),
        ],
        schema=ARROW_SCHEMA,
    )


def _to_batch(msgs: list[Message], topic: str, partition: int) -> pa.RecordBatch:
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
            micros.cast(pa.timestamp("us", tz="UTC")),
            pa.array(types - 1),
            pa.repeat(pa.scalar(False), n),
        ],
        schema=ARROW_SCHEMA,
    )


def read_range(
    options: SourceOptions, rng: OffsetRange, batch_rows: int = BATCH_ROWS
) -> Iterator[pa.RecordBatch]:
    """Read offsets [rng.start, rng.end) of one partition as Arrow batches (executor side).

    Reads until the consumer's position reaches rng.end: control records and aborted records
    occupy offsets but are never returned, so counting records would wait forever.

    Raises:
        SourceError: data loss with failOnDataLoss=true, a Kafka error, or no progress within
            kafkaConsumer.pollTimeoutMs; always naming topic, partition and offsets.
    """
    consumer = _new_consumer(options.consumer_conf("executor"))
    try:
        yield from _read(consumer, options, rng, batch_rows)
    finally:
        consumer.close()


def _read(
    consumer: Consumer, options: SourceOptions, rng: OffsetRange, batch_rows: int
) -> Iterator[pa.RecordBatch]:
    state = _ReadState(rng.start)
    consumer.assign([TopicPartition(rng.topic, rng.partition, rng.start)])
    while state.pos < rng.end:
        # Message objects are GC-tracked: no collections while a batch of them is built.
        with gc_paused():
            batch = _next_batch(consumer, options, rng, batch_rows, state)
        if batch is not None:
            yield batch


class _ReadState:
    """Where a range read stands: the next offset, and when it last moved."""

    __slots__ = ("pos", "last_progress")

    def __init__(self, pos: int) -> None:
        self.pos = pos
        self.last_progress = time.monotonic()


def _next_batch(
    consumer: Consumer, options: SourceOptions, rng: OffsetRange, batch_rows: int, st: _ReadState
) -> pa.RecordBatch | None:
    """Consume until `batch_rows` records are pending or the range ends; None when it ended empty.

    Raises:
        SourceError: as read_range.
    """
    topic, partition, end = rng.topic, rng.partition, rng.end
    where = TopicPartition(topic, partition)
    pending: list[Message] = []
    while st.pos < end:
        msgs = consumer.consume(
            max(1, min(batch_rows - len(pending), end - st.pos)), _CONSUME_TIMEOUT_S
        )
        if msgs:
            # (KafkaError == None raises, so no list.count(None) here.)
            failed = next((i for i, m in enumerate(msgs) if m.error() is not None), None)
            if failed is not None:
                # Records before the error are valid; the error decides where to go on.
                good = [m for m in msgs[:failed] if _offset(m) < end]
                pending.extend(good)
                if good:
                    st.pos = _offset(good[-1]) + 1
                error = cast(KafkaError, msgs[failed].error())
                restart = _handle_read_error(consumer, options, rng, st.pos, error)
                if restart is None:
                    break
                st.pos = restart
                st.last_progress = time.monotonic()
                continue
            if _offset(msgs[-1]) >= end:
                msgs = [m for m in msgs if _offset(m) < end]
            if msgs:
                pending.extend(msgs)
                st.pos = max(st.pos, _offset(msgs[-1]) + 1)
                st.last_progress = time.monotonic()
            if len(pending) >= batch_rows:
                return _to_batch(pending, topic, partition)
        now_pos = consumer.position([where])[0].offset
        if now_pos > st.pos:
            st.pos = now_pos
            st.last_progress = time.monotonic()
        elif time.monotonic() - st.last_progress > options.poll_timeout_ms / 1000:
            raise SourceError(
                f"no progress reading {topic}/{partition} for {options.poll_timeout_ms} ms "
                f"(kafkaConsumer.pollTimeoutMs): at offset {st.pos}, reading up to {end}"
            )
    return _to_batch(pending, topic, partition) if pending else None


def _handle_read_error(
    consumer: Consumer, options: SourceOptions, rng: OffsetRange, pos: int, err: KafkaError
) -> int | None:
    """Handle a consume error at `pos`: the offset to continue from, None to stop, or raise."""
    where = f"{rng.topic}/{rng.partition}"
    if err.code() not in _DATA_LOSS_CODES:
        raise SourceError(
            f"reading {where} at offset {pos} (range {rng.start}-{rng.end}): "
            f"{describe_kafka_error(err)}"
        ) from KafkaException(err)
    try:
        low, high = consumer.get_watermark_offsets(
            TopicPartition(rng.topic, rng.partition), timeout=_DRIVER_TIMEOUT_S, cached=False
        )
    except KafkaException as exc:
        raise SourceError(
            f"reading {where}: offset {pos} is out of range and the log bounds are unknown: "
            f"{describe_kafka_error(exc)}"
        ) from exc
    if pos < low:
        detail = f"offsets {pos}-{min(low, rng.end) - 1} were deleted (log now starts at {low})"
        resume = low
    else:
        detail = f"offset {pos} is beyond the end of the log ({high})"
        resume = rng.end
    if options.fail_on_data_loss:
        raise SourceError(
            f"data loss in {where} while reading {rng.start}-{rng.end}: {detail}. Set option "
            "failOnDataLoss=false to skip lost offsets"
        ) from KafkaException(err)
    logger.warning("data loss in %s: %s; failOnDataLoss=false, continuing", where, detail)
    if resume >= rng.end:
        return None
    consumer.assign([TopicPartition(rng.topic, rng.partition, resume)])
    return resume
