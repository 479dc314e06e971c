"""Batched asynchronous Kafka production for loadgen, in the loadgen process. Delivery reports
decide what counts; back-pressure (a full local queue) and delivery errors are counted and logged,
never swallowed."""

from __future__ import annotations

import logging
import threading
import time
from collections import Counter, deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from confluent_kafka import KafkaError, KafkaException, Message, Producer

from ipcount.config import Settings
from ipcount.errors import ConfigError
from ipcount.kafka.client import describe_kafka_error, with_client_logging
from ipcount.kafka.topics import missing_topics
from ipcount.verify.ledger import Ledger

__all__ = [
    "PRODUCER_DEFAULTS",
    "DeliveryStats",
    "RecordProducer",
    "BackgroundSender",
    "producer_config",
    "check_source_topic",
]

logger = logging.getLogger(__name__)

# Tuned for throughput; [kafka.producer] settings override them. Idempotence keeps librdkafka's
# internal retries from writing duplicates, so the ledger stays exact.
PRODUCER_DEFAULTS: dict[str, str] = {
    "enable.idempotence": "true",
    "linger.ms": "20",
    "batch.num.messages": "10000",
    "queue.buffering.max.messages": "500000",
}
_LOGGED_ERRORS = 10

DeliveryCallback = Callable[[KafkaError | None, Message], None]


def producer_config(settings: Settings, extra: Mapping[str, str] | None = None) -> dict[str, Any]:
    """loadgen's producer settings: defaults, then [kafka.producer], then `extra`; logging wired."""
    conf: dict[str, Any] = dict(PRODUCER_DEFAULTS)
    conf.update(settings.kafka.to_librdkafka("producer"))
    conf.update(extra or {})
    return with_client_logging(conf, "loadgen.librdkafka")


def check_source_topic(settings: Settings) -> None:
    """Fail unless the source topic exists (brokers may auto-create it with the wrong settings).

    Raises:
        ConfigError: the topic is missing (says to run `ipcount topics create`).
        BrokerError: no broker answers.
    """
    topic = settings.topics.source
    if missing_topics(settings, [topic]):
        raise ConfigError(
            f"source topic {topic!r} does not exist on {settings.kafka.bootstrap_servers}; "
            "create it first with `ipcount topics create` (same --config/--set as here), "
            "or point topics.source at an existing topic"
        )


@dataclass
class DeliveryStats:
    """Counters of one producer; `errors` counts delivery errors by error name."""

    produced: int = 0
    delivered: int = 0
    failed: int = 0
    backpressure: int = 0
    dropped: int = 0
    errors: Counter[str] = field(default_factory=Counter)
    first_error: str = ""

    def as_dict(self) -> dict[str, Any]:
        return {
            "produced": self.produced,
            "delivered": self.delivered,
            "failed": self.failed,
            "backpressure": self.backpressure,
            "dropped": self.dropped,
            "errors": dict(self.errors),
            "first_error": self.first_error,
        }


class RecordProducer:
    """A confluent-kafka Producer for one topic: batched produce with counted back-pressure."""

    def __init__(self, conf: Mapping[str, Any], topic: str) -> None:
        self.topic = topic
        self.stats = DeliveryStats()
        self._producer = Producer(dict(conf))

    def __len__(self) -> int:
        return len(self._producer)

    def note_failure(self, err: KafkaError | KafkaException | Exception, what: str = "") -> None:
        """Count and log one record that will not be delivered."""
        self.stats.failed += 1
        text = describe_kafka_error(err)
        name = err.name() if isinstance(err, KafkaError) else type(err).__name__
        self.stats.errors[name] += 1
        if not self.stats.first_error:
            self.stats.first_error = text
        if self.stats.failed <= _LOGGED_ERRORS:
            logger.warning("record not delivered to %s%s: %s", self.topic, what, text)
        elif self.stats.failed == _LOGGED_ERRORS + 1:
            logger.warning("more delivery errors; only counting from now on (see the summary)")

    def produce_batch(
        self,
        values: Sequence[bytes],
        keys: Sequence[bytes | None],
        timestamps: Sequence[int],
        callbacks: Sequence[DeliveryCallback],
        on_error: Callable[[int, KafkaException], None],
    ) -> None:
        """Produce a batch, waiting (polling delivery reports) while the local queue is full.

        `callbacks[i]` gets record i's delivery report; `on_error(i, exc)` is called instead when
        produce() refuses record i outright (it then never gets a report).
        """
        produce, topic = self._producer.produce, self.topic
        n, i, refused = len(values), 0, 0
        while i < n:
            try:
                for j in range(i, n):
                    i = j
                    produce(
                        topic, values[j], keys[j], on_delivery=callbacks[j], timestamp=timestamps[j]
                    )
                i = n
            except BufferError:
                # Back-pressure: the local queue is full; serve delivery reports, then retry.
                self.stats.backpressure += 1
                self._producer.poll(0.005)
            except KafkaException as exc:
                self.note_failure(exc, " (refused by produce())")
                on_error(i, exc)
                refused += 1
                i += 1
        self.stats.produced += n - refused
        self._producer.poll(0)

    def try_produce(
        self, value: bytes, key: bytes | None, timestamp_ms: int, on_delivery: DeliveryCallback
    ) -> bool:
        """Produce one record without waiting; False (counted) when the local queue is full.

        Raises:
            KafkaException: produce() refused the record (the caller counts it).
        """
        try:
            self._producer.produce(
                self.topic, value, key, on_delivery=on_delivery, timestamp=timestamp_ms
            )
        except BufferError:
            self.stats.backpressure += 1
            return False
        self.stats.produced += 1
        return True

    def poll(self, timeout: float = 0.0) -> int:
        """Serve delivery reports; returns how many were served."""
        return int(self._producer.poll(timeout))

    def flush(self, timeout: float) -> int:
        """Wait for every outstanding delivery report; returns how many are still unreported."""
        deadline = time.monotonic() + timeout
        remaining = len(self._producer)
        while remaining and time.monotonic() < deadline:
            remaining = int(self._producer.flush(min(1.0, max(0.0, deadline - time.monotonic()))))
        return remaining


class BackgroundSender:
    """Non-blocking submission for the HTTP service: a thread polls delivery reports, retries
    records the full local queue refused (kept in a bounded backlog), and saves the ledger
    periodically. The ledger only ever counts delivered records.
    """

    def __init__(
        self,
        conf: Mapping[str, Any],
        topic: str,
        ledger: Ledger,
        *,
        ledger_path: str | Path | None = None,
        save_interval: float = 5.0,
        max_backlog: int = 100_000,
    ) -> None:
        self.producer = RecordProducer(conf, topic)
        self.stats = self.producer.stats
        self.ledger = ledger
        self.ledger_path = Path(ledger_path) if ledger_path else None
        self.save_interval = save_interval
        self.max_backlog = max_backlog
        self.saves = 0
        self._backlog: deque[tuple[bytes, bytes | None, int, DeliveryCallback]] = deque()
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="loadgen-sender", daemon=True)

    @property
    def backlog(self) -> int:
        return len(self._backlog)

    def start(self) -> None:
        self._thread.start()

    def _on_delivery(self, err: KafkaError | None, msg: Message) -> None:
        if err is not None:
            self.producer.note_failure(err)
            return
        self.stats.delivered += 1
        key = msg.key()
        if key is not None:
            self.ledger.add(msg.timestamp()[1], key.decode("utf-8"))

    def _on_delivery_malformed(self, err: KafkaError | None, msg: Message) -> None:
        if err is not None:
            self.producer.note_failure(err)
            return
        self.stats.delivered += 1
        self.ledger.add_malformed()

    def _produce_one(self, value: bytes, key: bytes | None, ts: int, cb: DeliveryCallback) -> bool:
        try:
            return self.producer.try_produce(value, key, ts, cb)
        except KafkaException as exc:
            self.producer.note_failure(exc, " (refused by produce())")
            return True  # counted as failed; never retried

    def submit(
        self, value: bytes, key: bytes | None, timestamp_ms: int, *, malformed: bool = False
    ) -> None:
        """Hand one record to Kafka; never waits (a full local queue parks it in the backlog).

        A delivered record enters the ledger by its key (the client IP) and timestamp, or as
        malformed when `malformed` is set (a line the job will reject).
        """
        cb = self._on_delivery_malformed if malformed else self._on_delivery
        with self._lock:
            if not self._backlog and self._produce_one(value, key, timestamp_ms, cb):
                return
            if len(self._backlog) >= self.max_backlog:
                self.stats.dropped += 1
                if self.stats.dropped == 1 or self.stats.dropped % 10_000 == 0:
                    logger.error(
                        "producer queue and backlog (%d) full: %d records dropped so far "
                        "(not in the ledger)", self.max_backlog, self.stats.dropped,
                    )  # fmt: skip
                return
            self._backlog.append((value, key, timestamp_ms, cb))

    def _drain_backlog(self) -> None:
        with self._lock:
            while self._backlog:
                value, key, ts, cb = self._backlog[0]
                if not self._produce_one(value, key, ts, cb):
                    return
                self._backlog.popleft()

    def save_ledger(self) -> None:
        """Write the ledger now (atomically), if a path was given."""
        if self.ledger_path is not None:
            self.ledger.save(self.ledger_path)
            self.saves += 1

    def _run(self) -> None:
        next_save = time.monotonic() + self.save_interval
        while not self._stop.is_set():
            self.producer.poll(0.05)
            if self._backlog:
                self._drain_backlog()
            if time.monotonic() >= next_save:
                self.save_ledger()
                next_save = time.monotonic() + self.save_interval

    def close(self, timeout: float = 30.0) -> int:
        """Stop the thread, send the backlog, flush, save the ledger; returns unreported records."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join()
        deadline = time.monotonic() + timeout
        while self._backlog and time.monotonic() < deadline:
            self._drain_backlog()
            self.producer.poll(0.05)
        with self._lock:
            lost = len(self._backlog)
            if lost:
                self.stats.dropped += lost
                logger.error("%d backlog records not sent before the shutdown deadline", lost)
                self._backlog.clear()
        remaining = self.producer.flush(max(0.0, deadline - time.monotonic()))
        if remaining:
            logger.error(
                "%d records without a delivery report at shutdown (not in the ledger)", remaining
            )
        self.save_ledger()
        return remaining
