"""Driver-side Kafka lookups of the source: partitions, earliest/latest offsets and the latest
record event time."""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping
from typing import Any, cast

from confluent_kafka import Consumer, IsolationLevel, KafkaError, KafkaException, TopicPartition
from confluent_kafka.admin import AdminClient, OffsetSpec

from ipcount.errors import SourceError
from ipcount.kafka.client import describe_kafka_error, with_client_logging
from ipcount.source.consumer import CONSUME_TIMEOUT_S, DRIVER_TIMEOUT_S, new_consumer, offset_of
from ipcount.source.offsets import TopicPartitionKey
from ipcount.source.options import SourceOptions

__all__ = ["KafkaOffsetReader"]

logger = logging.getLogger(__name__)

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
            self._consumer = new_consumer(self._options.consumer_conf("driver"))
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
            deadline = time.monotonic() + DRIVER_TIMEOUT_S
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
                request, isolation_level=isolation, request_timeout=DRIVER_TIMEOUT_S
            )
        except KafkaException as exc:
            raise SourceError(
                f"cannot look up {which} offsets: {describe_kafka_error(exc)}"
            ) from exc
        result: dict[TopicPartitionKey, int] = {}
        for tp, fut in futures.items():
            try:
                result[(tp.topic, tp.partition)] = int(
                    fut.result(timeout=DRIVER_TIMEOUT_S + 5).offset
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
            futures = self._get_admin().list_offsets(request, request_timeout=DRIVER_TIMEOUT_S)
            for tp, fut in futures.items():
                info = fut.result(timeout=DRIVER_TIMEOUT_S + 5)
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
            for msg in consumer.consume(1000, CONSUME_TIMEOUT_S):
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
                if offset_of(msg) < ends[tp] and ts_type != 0:
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
