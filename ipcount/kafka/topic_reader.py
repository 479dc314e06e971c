"""Read a topic as a downstream consumer would (read_committed by default): follow it, or read it
to its end. Driver/CLI side: `ipcount consume`, `verify`, the sink."""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Iterator, Mapping
from typing import Any, cast

from confluent_kafka import Consumer, KafkaException, TopicPartition

from ipcount.errors import BrokerError, ConfigError, IpcountError
from ipcount.kafka.client import describe_kafka_error, with_client_logging
from ipcount.kafka.quirks import BrokerQuirks, broker_quirks
from ipcount.kafka.records import SinkRecord
from ipcount.kafka.watermarks import partition_offsets

__all__ = [
    "partition_offsets",
    "ISOLATION_LEVELS",
    "TopicReader",
    "consumer_conf",
]

logger = logging.getLogger(__name__)

ISOLATION_LEVELS = ("read_committed", "read_uncommitted")
# noida-db answers an empty fetch at once, so an idle consumer would spin (~0.5 core client plus
# ~0.4 core broker; BrokerQuirks.spins_on_empty_fetch). librdkafka fetches in its own thread, so
# sleeping in Python does not help, and pause()/resume() loses records (a partition with no
# consumed record yet is reset to auto.offset.reset on resume). An idle reader on noida-db
# therefore unassigns its partitions and assigns them again at concrete offsets it tracks
# (measured: ~0.0 core while idle, records picked up within one back-off). On Apache Kafka the
# broker holds an empty fetch open (fetch.wait.max.ms): the reader keeps its partitions.
# A new topic's leader is not yet known on every broker thread: ask again in a moment.
_IDLE_BACKOFF_START = 0.05
_IDLE_BACKOFF_MAX = 1.0
# While idle, each look for new records fetches for this long only (records already on the
# broker come back within milliseconds), so the spinning is a few % of the back-off.
_IDLE_FETCH_SECONDS = 0.05
# read_to_end's consume() timeout: it re-checks the positions after each. consume() waits its
# whole timeout unless max_records arrive, so a small topic's read (the progress topic, which a
# sink task reads each time it takes over its partition's producer) ends this long after its last
# record came: 50 ms made a task's two reads ~0.1 s slower, 5 ms ~8 ms slower. It starts at 1 ms
# and doubles with each empty poll up to 8 ms, so a read that waits (an open transaction holds
# read_committed readers back) does not spin.
_READ_TO_END_POLL_SECONDS = (0.001, 0.008)


def consumer_conf(
    base: Mapping[str, str], isolation: str, group_prefix: str = "ipcount-reader"
) -> dict[str, Any]:
    """A librdkafka consumer config for a reader that assigns partitions itself and commits nothing.

    Raises:
        ConfigError: unknown isolation level.
    """
    if isolation not in ISOLATION_LEVELS:
        raise ConfigError(
            f"isolation level must be one of {', '.join(ISOLATION_LEVELS)}, got {isolation!r}"
        )
    conf: dict[str, Any] = {"group.id": f"{group_prefix}-{uuid.uuid4().hex[:12]}"}
    conf.update(base)
    # Offsets are chosen by the reader, never committed: it joins no group and leaves no state.
    conf.update(
        {"isolation.level": isolation, "enable.auto.commit": False, "enable.partition.eof": False}
    )
    return with_client_logging(conf, "ipcount.consume.librdkafka")


class TopicReader:
    """A consumer assigned to every partition of one topic, with idle back-off.

    Use as a context manager; `read_to_end()` for a snapshot, `follow()` to tail the topic.
    """

    def __init__(
        self,
        conf: Mapping[str, str],
        topic: str,
        *,
        isolation: str = "read_committed",
        from_beginning: bool = True,
        timeout: float = 10.0,
        topic_setting: str = "topics.sink",
        quirks: BrokerQuirks | None = None,
        start_at: Mapping[int, int] | None = None,
        lookups: Any = None,
    ) -> None:
        """`start_at`: partitions that start at an offset of their own (from_beginning only);
        one outside its partition's log now (truncated, re-created) starts at the log's start.
        `lookups`: a read_uncommitted consumer that fetches nothing, for this reader's offset
        lookups (the caller's: it outlives the reader), instead of one of its own."""
        self.topic = topic
        self.quirks = quirks if quirks is not None else broker_quirks(conf, timeout=timeout)
        self.isolation = isolation
        self.timeout = timeout
        # What the broker's quirks need first: the caller's settings win.
        conf = self._base = {**self.quirks.consumer_defaults(), **conf}
        self._consumer = Consumer(consumer_conf(conf, isolation))
        try:
            md = self._consumer.list_topics(timeout=timeout)
        except KafkaException as exc:
            self._consumer.close()
            raise BrokerError(
                f"cannot read metadata from {conf.get('bootstrap.servers')}: "
                f"{describe_kafka_error(exc)}"
            ) from exc
        if topic not in md.topics or md.topics[topic].error is not None:
            self._consumer.close()
            raise ConfigError(
                f"topic {topic!r} ({topic_setting}) does not exist on "
                f"{conf.get('bootstrap.servers')}: run `ipcount topics create` or fix the setting"
            )
        self.partitions = sorted(md.topics[topic].partitions)
        # Consumers that only look up ends, kept, per isolation level: a broker answers one
        # connection's requests in order, so a lookup on the fetching consumer's connection
        # waits behind its long-polling fetch (up to fetch.wait.max.ms, 500 ms by default).
        self._probes: dict[str, Any] = {}
        self._lookups = lookups
        self._assigned = False
        try:
            if from_beginning:
                self._next = self._starts(start_at)
            else:
                # This consumer's own query answers the last stable offset under read_committed,
                # which is where a new read_committed reader starts.
                self._next = {
                    p: partition_offsets(self._consumer, topic, p, timeout)[1]
                    for p in self.partitions
                }
        except KafkaException as exc:
            self.close()
            raise BrokerError(
                f"cannot query the end of {topic}: {describe_kafka_error(exc)}"
            ) from exc
        except BaseException:
            self.close()
            raise
        self._idle = _IDLE_BACKOFF_START

    def _starts(self, start_at: Mapping[int, int] | None) -> dict[int, int]:
        at = start_at or {}
        return {
            p: at[p] if low <= at.get(p, -1) <= high else low
            for p, (low, high) in self.watermarks().items()
        }

    def restart(self, start_at: Mapping[int, int] | None = None) -> None:
        """Read again from the log's start, or from `start_at` as the constructor takes it, with
        the same consumer: a reader kept for repeated short reads opens no new client (in
        production each is a connection, a TLS handshake and a SASL login).

        Raises:
            KafkaException / BrokerError: the broker did not answer the offset lookups.
        """
        self.release()
        self._next = self._starts(start_at)
        self._idle = _IDLE_BACKOFF_START

    def release(self) -> None:
        """Stop fetching until the next read: keep the positions, give up the partitions."""
        if self._assigned:
            self.positions()  # keep what the consumer skipped (markers) before letting go
            self._consumer.unassign()
            self._assigned = False

    def __enter__(self) -> TopicReader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Close the consumer (no offsets are committed)."""
        self._consumer.close()
        for probe in self._probes.values():
            probe.close()
        self._probes = {}

    def watermarks(self) -> dict[int, tuple[int, int]]:
        """(low, high) offsets per partition: the true end, whatever this reader's isolation.

        A read_committed consumer's watermark query answers the last stable offset instead, which
        stops short of open transactions.
        """
        probe = self._probe("read_uncommitted")
        return {p: self._offsets(probe, p) for p in self.partitions}

    def _offsets(self, probe: Consumer, partition: int) -> tuple[int, int]:
        return partition_offsets(probe, self.topic, partition, self.timeout)

    def ends(self) -> dict[int, int]:
        """Per partition, the end this reader may read to now: under read_committed the last
        stable offset, a transaction boundary (every record below it is decided, the first
        undecided record is at it); under read_uncommitted the high watermark. One ListOffsets
        request per partition: from the reader's own consumer while it holds no partition, else
        from a consumer kept for this reader's life that fetches nothing.

        Raises:
            BrokerError: an end offset could not be queried (the broker is unreachable).
        """
        return self._ends(self.isolation)

    def high_watermarks(self) -> dict[int, int]:
        """Per partition, the true end (records of open transactions included), whatever this
        reader's isolation; with `ends()` it tells whether a partition holds undecided records.
        One ListOffsets request per partition, as for `ends()`.

        Raises:
            BrokerError: an end offset could not be queried (the broker is unreachable).
        """
        return self._ends("read_uncommitted")

    def _ends(self, isolation: str) -> dict[int, int]:
        consumer = self._probe(isolation)
        return {p: self._offsets(consumer, p)[1] for p in self.partitions}

    def _probe(self, isolation: str) -> Any:
        if isolation == "read_uncommitted" and self._lookups is not None:
            return self._lookups
        if isolation == self.isolation and not self._assigned:
            return self._consumer  # it fetches nothing now: no fetch to wait behind
        consumer = self._probes.get(isolation)
        if consumer is None:
            consumer = Consumer(consumer_conf(self._base, isolation, "ipcount-probe"))
            self._probes[isolation] = consumer
        return consumer

    def positions(self) -> dict[int, int]:
        """The next offset this reader will read per partition (past transaction markers and
        aborted records it has skipped)."""
        if self._assigned:
            tps = self._consumer.position([TopicPartition(self.topic, p) for p in self.partitions])
            for tp in tps:
                if tp.offset >= 0 and tp.offset > self._next[tp.partition]:
                    self._next[tp.partition] = tp.offset
        return dict(self._next)

    def caught_up(self) -> bool:
        """Whether this reader has received every record it may read now (under read_committed:
        every committed transaction's records, on every partition). One ListOffsets request per
        partition.

        Raises:
            BrokerError: an end offset could not be queried (the broker is unreachable).
        """
        return not self._behind(strict=True)

    def _behind(self, strict: bool = False) -> bool:
        """Whether some partition holds records this reader has not received yet: its position
        is below the end this consumer may read to (the last stable offset under read_committed).
        One ListOffsets request per partition."""
        for p, pos in self.positions().items():
            try:
                _, end = partition_offsets(self._consumer, self.topic, p, self.timeout)
            except BrokerError as exc:
                if strict:
                    raise
                logger.debug("end offset of %s/%d unknown: %s", self.topic, p, exc)
                return False
            if pos < end:
                return True
        return False

    def poll(self, max_records: int = 10_000, timeout: float = 0.5) -> list[SinkRecord]:
        """Up to `max_records` records; after an empty poll with nothing left to read, stop
        fetching for a growing back-off (so neither this client nor the broker spins) before the
        next look. An empty poll while records are waiting is a slow fetch, not idleness (noida-db
        answers with a partition's whole backlog): the reader keeps its partitions and waits."""
        if not self._assigned:
            if self._idle > _IDLE_BACKOFF_START:
                timeout = min(timeout, _IDLE_FETCH_SECONDS)
            self._consumer.assign([TopicPartition(self.topic, p, o) for p, o in self._next.items()])
            self._assigned = True
        try:
            msgs = self._consumer.consume(max_records, timeout)
        except KafkaException as exc:
            raise BrokerError(f"reading {self.topic} failed: {describe_kafka_error(exc)}") from exc
        out = []
        for m in msgs:
            err = m.error()
            if err is not None:
                if err.fatal() or not err.retriable():
                    logger.warning(
                        "consumer error on %s: %s", self.topic, describe_kafka_error(err)
                    )
                continue
            rec = SinkRecord(
                str(m.topic()),
                int(m.partition() or 0),
                int(m.offset() or 0),
                m.key(),
                m.value(),
                m.timestamp()[1],
                cast("list[tuple[str, bytes]] | None", m.headers()),
            )
            self._next[rec.partition] = rec.offset + 1
            out.append(rec)
        if out:
            self._idle = _IDLE_BACKOFF_START
        elif not self.quirks.spins_on_empty_fetch:
            pass  # the broker held the empty fetch open: no back-off, so no end to look up
        elif self._behind():
            # Records are there but their fetch has not arrived yet: releasing the partitions
            # now would drop that fetch, and a reader whose fetches always outlast one look
            # would never advance.
            self._idle = _IDLE_BACKOFF_START
        else:
            self.release()
            time.sleep(self._idle)
            self._idle = min(self._idle * 2, _IDLE_BACKOFF_MAX)
        return out

    def read_to_end(
        self, deadline_seconds: float = 60.0, until: Mapping[int, int] | None = None
    ) -> Iterator[SinkRecord]:
        """Every record up to the topic's end as it is now, in this reader's isolation level.

        Stops when every partition's position reaches the high watermark taken at the start
        (positions, not record counts: aborted records and transaction markers occupy offsets).
        With `until`, only those partitions are waited for, each up to its offset there (records
        past it may come too).

        Raises:
            IpcountError: a partition did not reach its end within `deadline_seconds`; with
                read_committed that means an open transaction holds readers back.
        """
        marks = self.watermarks()
        ends = {p: high for p, (_, high) in marks.items()}
        if until is not None:
            ends = {p: min(end, until[p]) for p, end in ends.items() if p in until}
        deadline = time.monotonic() + deadline_seconds
        pending = {p for p, end in ends.items() if end > self._next[p]}
        wait, longest = _READ_TO_END_POLL_SECONDS
        while pending:
            # consume() waits its whole timeout unless max_records arrive: a short one, so a small
            # topic (the progress markers every start and first commit read) ends at its end,
            # not 0.5 s later.
            got = self.poll(timeout=wait)
            yield from got
            wait = _READ_TO_END_POLL_SECONDS[0] if got else min(wait * 2, longest)
            pos = self.positions()
            pending = {p for p in pending if pos.get(p, -1) < ends[p]}
            if pending and time.monotonic() > deadline:
                stuck = ", ".join(f"[{p}] at {pos.get(p)} of {ends[p]}" for p in sorted(pending))
                hint = ""
                if self.isolation == "read_committed":
                    hint = (
                        ": an open transaction holds read_committed readers back. A killed "
                        "producer's transaction stays open until a producer with the same "
                        "transactional.id starts again (restart the job) or the broker times it "
                        "out (transaction.timeout.ms; noida-db never does)"
                    )
                raise IpcountError(
                    f"{self.topic} did not reach its end within {deadline_seconds:g}s: "
                    f"{stuck}{hint}"
                )

    def follow(
        self, idle_exit: float | None = None, max_records: int | None = None
    ) -> Iterator[SinkRecord]:
        """Tail the topic: stop after `idle_exit` seconds without records or `max_records` records
        (None: run until interrupted)."""
        seen = 0
        last: float | None = None  # the idle clock starts after the first fetch attempt
        while max_records is None or seen < max_records:
            batch = self.poll(
                max_records=min(10_000, max_records - seen) if max_records else 10_000
            )
            now = time.monotonic()
            if batch:
                last = now
                seen += len(batch)
                yield from batch
            elif last is None:
                last = now
            elif idle_exit is not None and now - last >= idle_exit:
                return
