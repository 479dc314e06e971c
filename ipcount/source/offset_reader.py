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
from ipcount.formats.accesslog import ParseError, parse_record
from ipcount.kafka.client import describe_kafka_error, with_client_logging
from ipcount.kafka.watermarks import LEADER_MOVING
from ipcount.source.consumer import DRIVER_TIMEOUT_S, new_consumer, offset_of
from ipcount.source.offsets import TopicPartitionKey
from ipcount.source.options import SourceOptions

__all__ = ["KafkaOffsetReader", "nginx_event_ms"]

logger = logging.getLogger(__name__)

# Driver tail reads look at the last N offsets per partition first, widening N by x16 when the
# window holds no trusted record (only control, aborted, malformed or future records).
_TAIL_WINDOW = 16
_TAIL_ATTEMPTS = 4
_TAIL_TIMEOUT_S = 10.0
# A pacing look at the tails waits in short polls (the records are there: the end is known) and
# gives up soon; the batch interval then decides.
_PEEK_POLL_S = 0.005
_PEEK_TIMEOUT_S = 0.5
# One ListOffsets attempt. librdkafka's admin client sends each partition's request to the leader
# its metadata names, in any state, and waits for that node to be up for the whole request
# timeout (rdkafka_admin.c, WAIT_BROKER); a request that fails there is dropped by the fan-out's
# merge, which leaves the partition answered "unknown" (-1001) without an error. With a killed
# leader a 30 s attempt used the lookup's whole deadline: short attempts, each by a new client
# (fresh metadata names the leader elected meanwhile), leave room to ask again. A healthy leader
# answers in milliseconds.
_ATTEMPT_TIMEOUT_S = 5.0
# Answers of a leader that moved since the client's metadata was fetched; librdkafka's own "No
# leaders found" (_NOENT) when its connections were reset and its metadata holds no leader; an
# offset it answers "unknown" (LEADER_NOT_AVAILABLE, below: the request to a dead leader timed
# out); and a new leader whose high watermark is not caught up yet (OFFSET_NOT_AVAILABLE).
_STALE_LEADER = {
    KafkaError.FENCED_LEADER_EPOCH,
    KafkaError.UNKNOWN_LEADER_EPOCH,
    KafkaError.NOT_LEADER_FOR_PARTITION,
    KafkaError.LEADER_NOT_AVAILABLE,
    KafkaError.OFFSET_NOT_AVAILABLE,
    KafkaError._NOENT,
}
# Retried until the lookup's deadline: a leader moving (the one set the sink's lookups in
# kafka/watermarks.py retry, e.g. a killed leader's _DESTROY_BROKER), a request that timed out,
# and librdkafka's "No leaders found".
_RETRIABLE_METADATA = LEADER_MOVING | {
    KafkaError._TIMED_OUT,
    KafkaError.REQUEST_TIMED_OUT,
    KafkaError._NOENT,
}


def nginx_event_ms(value: bytes | None) -> int | None:
    """The event time (epoch ms) of a record that counts as an nginx combined-format line, or
    None: the rule the read tasks count by, and no record content raises here (a line the driver
    cannot use is only not a heartbeat base; the read tasks reject it with its reason)."""
    if value is None:
        return None
    try:
        return parse_record(value).event_ms
    except ParseError:
        return None


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
        self._newest_allowed: int | None = None

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
        # The admin client's connection, not the consumer's: a broker answers one connection's
        # requests in order, and after a look at the tails (_read_between) the consumer's holds
        # a fetch open at the log's end for fetch.wait.max.ms (500 ms by default), which a
        # metadata request there waited behind: ~0.45 s at every start of a live query.
        admin = self._get_admin()
        result: list[TopicPartitionKey] = []
        for topic in self._options.topics:
            deadline = time.monotonic() + DRIVER_TIMEOUT_S
            while True:
                err: KafkaError | KafkaException | None
                try:
                    md = admin.list_topics(topic, timeout=max(0.1, deadline - time.monotonic()))
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
        deadline = time.monotonic() + DRIVER_TIMEOUT_S
        while True:
            attempt_s = max(1.0, min(_ATTEMPT_TIMEOUT_S, deadline - time.monotonic()))
            try:
                return self._list_offsets(partitions, which, read_committed, attempt_s)
            except KafkaException as exc:
                err = exc.args[0] if exc.args else None
                # A restarted or re-elected leader answers with a newer leader epoch
                # (FENCED_LEADER_EPOCH, NOT_LEADER...) until the client refreshes its metadata.
                retriable = isinstance(err, KafkaError) and (
                    err.retriable() or err.code() in _RETRIABLE_METADATA
                )
                if not retriable or time.monotonic() >= deadline:
                    raise SourceError(
                        f"cannot look up the {which} offsets of "
                        f"{', '.join(f'{t}/{p}' for t, p in partitions)}: "
                        f"{describe_kafka_error(exc)}"
                    ) from exc
                logger.info("looking up %s offsets: %s; retrying", which, describe_kafka_error(exc))
                if isinstance(err, KafkaError) and err.code() in _STALE_LEADER:
                    # librdkafka's admin client keeps the leader epoch it last saw and sends it
                    # again on a retry: measured against a leader that was killed and elected
                    # again, FENCED_LEADER_EPOCH for as long as the lookup's 30 s deadline. A new
                    # client starts from fresh metadata.
                    self._admin = None
                time.sleep(0.2)

    def _list_offsets(
        self,
        partitions: list[TopicPartitionKey],
        which: str,
        read_committed: bool | None,
        timeout_s: float,
    ) -> dict[TopicPartitionKey, int]:
        # confluent_kafka's OffsetSpec factories carry no annotations.
        spec = (
            OffsetSpec.earliest()  # type: ignore[no-untyped-call]
            if which == "earliest"
            else OffsetSpec.latest()  # type: ignore[no-untyped-call]
        )
        committed = self._options.read_committed if read_committed is None else read_committed
        isolation = IsolationLevel.READ_COMMITTED if committed else IsolationLevel.READ_UNCOMMITTED
        request = {TopicPartition(t, p): spec for t, p in partitions}
        futures = self._get_admin().list_offsets(
            request, isolation_level=isolation, request_timeout=timeout_s
        )
        found = {
            (tp.topic, tp.partition): int(fut.result(timeout=timeout_s + 5).offset)
            for tp, fut in futures.items()
        }
        unknown = sorted(tp for tp, offset in found.items() if offset < 0)
        if unknown:
            # librdkafka answers OFFSET_INVALID (-1001) for a partition whose leader's request
            # failed (a killed leader: timed out waiting for it, see _ATTEMPT_TIMEOUT_S): never
            # the log's end, ask again with fresh metadata.
            raise KafkaException(
                KafkaError(
                    KafkaError.LEADER_NOT_AVAILABLE,
                    f"offset unknown for {', '.join(f'{t}/{p}' for t, p in unknown)} "
                    "(no leader answered)",
                )
            )
        return found

    def latest_event_ms(
        self, ends: Mapping[TopicPartitionKey, int], now_ms: int | None = None
    ) -> int | None:
        """The newest trusted event time (epoch ms) among the records before `ends`, or None.

        A record's event time is its Kafka timestamp, or with eventTimeFormat=nginx-combined its
        $time_local if the line is valid (the rule the job counts by). Event times more than
        maxFutureSkewMs past `now_ms` are not trusted: a bad clock must not become the heartbeats'
        base. Per partition, the record the broker names for MAX_TIMESTAMP (KIP-734) is read and
        checked first: when it lies before the end and is trusted, it is the partition's newest
        event even out of order. Otherwise (a malformed, future or aborted record, or a broker
        without the lookup) the last records before the end are read, widening the window while it
        holds no trusted record: a lower bound when event times arrive out of order.
        """
        best: int | None = None
        skew = self._options.max_future_skew_ms
        self._newest_allowed = now_ms + skew if skew > 0 and now_ms is not None else None
        pending = {tp: end for tp, end in ends.items() if end > 0}
        found: dict[TopicPartitionKey, int] = {}
        candidates = self.max_timestamp_offsets(pending)
        if candidates:
            found = self._read_between(candidates, {tp: o + 1 for tp, o in candidates.items()})
            for tp, ts in found.items():
                best = ts if best is None else max(best, ts)
        # The last records too: the MAX_TIMESTAMP record is the newest by Kafka timestamp, which
        # a producer may set apart from the event time. Partitions whose candidate was trusted
        # need no wider window than the first.
        have_candidate = set(found) if candidates else set()
        window = _TAIL_WINDOW
        for _ in range(_TAIL_ATTEMPTS):
            if not pending:
                break
            starts = {tp: max(0, end - window) for tp, end in pending.items()}
            found = self._read_between(starts, pending)
            for tp, ts in found.items():
                best = ts if best is None else max(best, ts)
            # Done with partitions that had a trusted record (here or as their MAX_TIMESTAMP
            # candidate), or whose whole log was scanned.
            pending = {
                tp: e
                for tp, e in pending.items()
                if tp not in found and tp not in have_candidate and starts[tp] > 0
            }
            window *= 16
        return best

    def tail_event_ms(
        self, ends: Mapping[TopicPartitionKey, int], now_ms: int | None = None
    ) -> int | None:
        """The newest trusted event time among the last few records before `ends` (per
        partition), or None: a quick look for pacing (source.pacing), never a heartbeat's base;
        an out-of-order tail may hide a newer event time."""
        skew = self._options.max_future_skew_ms
        self._newest_allowed = now_ms + skew if skew > 0 and now_ms is not None else None
        pending = {tp: end for tp, end in ends.items() if end > 0}
        if not pending:
            return None
        starts = {tp: max(0, end - _TAIL_WINDOW) for tp, end in pending.items()}
        found = self._read_between(starts, pending, _PEEK_POLL_S, _PEEK_TIMEOUT_S)
        return max(found.values(), default=None)

    def max_timestamp_offsets(
        self, ends: Mapping[TopicPartitionKey, int]
    ) -> dict[TopicPartitionKey, int]:
        """Per partition, the offset of its record with the largest timestamp, where that record
        lies before `ends` (ListOffsets MAX_TIMESTAMP, Kafka 3.0+); brokers or partitions that do
        not answer are left out. The record still has to be read and trusted."""
        request = {
            TopicPartition(t, p): OffsetSpec.max_timestamp()  # type: ignore[no-untyped-call]
            for (t, p) in ends
        }
        if not request:
            return {}
        out: dict[TopicPartitionKey, int] = {}
        try:
            # Best effort: a killed leader's partition answers -1001 after the attempt's timeout.
            futures = self._get_admin().list_offsets(request, request_timeout=_ATTEMPT_TIMEOUT_S)
            for tp, fut in futures.items():
                info = fut.result(timeout=_ATTEMPT_TIMEOUT_S + 5)
                key = (tp.topic, tp.partition)
                if 0 <= info.offset < ends[key]:
                    out[key] = int(info.offset)
        except KafkaException as exc:
            logger.debug("MAX_TIMESTAMP lookup failed: %s", describe_kafka_error(exc))
            return {}
        return out

    def _event_ms(self, msg: Any) -> int | None:
        """A record's trusted event time, or None (malformed, no timestamp, or too far ahead)."""
        if self._options.event_time_format == "nginx-combined":
            ts: int | None = nginx_event_ms(msg.value())
            if ts is None:
                return None
        else:
            ts_type, ts = msg.timestamp()
            if ts_type == 0:
                return None
        limit = self._newest_allowed
        if ts is not None and limit is not None and ts > limit:
            return None
        return ts

    def _read_between(
        self,
        starts: Mapping[TopicPartitionKey, int],
        ends: Mapping[TopicPartitionKey, int],
        poll_s: float = _PEEK_POLL_S,
        timeout_s: float = _TAIL_TIMEOUT_S,
    ) -> dict[TopicPartitionKey, int]:
        """The newest trusted event time per partition among its records from `starts` up to
        `ends` (partitions without one are left out), in short polls: the records are there (a
        0.1 s poll waited it out for the last few, 0.10 s of a 0.13 s flush heartbeat's
        planning). The consumer holds the partitions only meanwhile: an assigned consumer keeps
        fetching in the background (on noida-db in a tight loop), and the next look assigns
        afresh anyway."""
        consumer = self._get_consumer()
        consumer.assign([TopicPartition(t, p, o) for (t, p), o in starts.items()])
        try:
            return self._drain_tail(consumer, ends, poll_s, timeout_s)
        finally:
            consumer.unassign()

    def _drain_tail(
        self,
        consumer: Consumer,
        ends: Mapping[TopicPartitionKey, int],
        poll_s: float,
        timeout_s: float,
    ) -> dict[TopicPartitionKey, int]:
        found: dict[TopicPartitionKey, int] = {}
        tps = [TopicPartition(t, p) for t, p in ends]
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            for msg in consumer.consume(1000, poll_s):
                err = msg.error()
                if err is not None:
                    if err.code() == KafkaError._PARTITION_EOF:
                        continue
                    raise SourceError(
                        f"reading the last records of {msg.topic()}/{msg.partition()}: "
                        f"{describe_kafka_error(err)}"
                    )
                tp = (cast(str, msg.topic()), cast(int, msg.partition()))
                if offset_of(msg) >= ends[tp]:
                    continue
                ts = self._event_ms(msg)
                if ts is not None:
                    found[tp] = max(found.get(tp, ts), ts)
            positions = consumer.position(tps)
            if all(pos.offset >= ends[(pos.topic, pos.partition)] for pos in positions):
                return found
        # Heartbeats are best effort: go on with what was found rather than fail the query.
        logger.warning(
            "timed out after %gs reading the last records of %s; event time may lag",
            timeout_s,
            sorted(ends),
        )
        return found
