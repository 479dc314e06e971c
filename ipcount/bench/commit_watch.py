"""The latency bench's read_committed watcher of the sink topic: every result with the moment this
process received it. Bench process side."""

from __future__ import annotations

import math
import threading
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

from confluent_kafka import Consumer, TopicPartition

from ipcount.kafka.topic_reader import consumer_conf, partition_offsets

if TYPE_CHECKING:
    from ipcount.config import Settings

__all__ = ["CommitWatcher", "Received", "percentile"]

# How often the watcher asks for the last stable offset (read_committed end) of each partition.
# Asking is one small request; fetching instead would spin (noida-db answers empty fetches at once).
_WATCH_INTERVAL_S = 0.02


@dataclass(frozen=True)
class Received:
    """One committed result and when this process received it (epoch ms)."""

    at_ms: int
    window_start: int
    window_end: int
    ip: str
    count: int

    @property
    def latency_s(self) -> float:
        return (self.at_ms - self.window_end) / 1000


class CommitWatcher:
    """Follows the sink topic as a read_committed consumer and timestamps every record on receipt.

    It polls the last stable offset of each partition every 20 ms and fetches only when it moved,
    so it neither spins nor adds more than ~20 ms to a measured latency.
    """

    def __init__(self, settings: Settings) -> None:
        from ipcount.formats.avro import make_codec

        self.topic = settings.topics.sink
        self._codec = make_codec(
            settings.sink.wire_format, settings.sink.schema_registry_url, settings.topics.sink
        )
        conf = consumer_conf(settings.kafka.to_librdkafka("consumer"), "read_committed", "bench")
        self._consumer = Consumer(conf)
        md = self._consumer.list_topics(self.topic, timeout=10)
        self._next = {p: 0 for p in md.topics[self.topic].partitions}
        self.received: list[Received] = []
        self.error: BaseException | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="bench-watch", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(10)
        self._consumer.close()

    def _run(self) -> None:
        try:
            while not self._stop.wait(_WATCH_INTERVAL_S):
                self._check()
        except BaseException as exc:  # reported by run_latency
            self.error = exc

    def _check(self) -> None:
        consumer = self._consumer
        ends = {}
        for p, pos in self._next.items():
            # read_committed: the last stable offset, i.e. what a read_committed reader can see.
            # A new sink topic's leader may be unknown for a moment: partition_offsets retries.
            _, high = partition_offsets(consumer, self.topic, p, 10.0)
            if high > pos:
                ends[p] = high
        if not ends:
            return
        consumer.assign([TopicPartition(self.topic, p, self._next[p]) for p in ends])
        try:
            while ends:
                # consume() waits out its timeout unless 10k records arrive, and a record's
                # arrival is stamped after it returns: a short one, or latency reads up to 0.5 s
                # high.
                msgs = consumer.consume(10_000, 0.05)
                now_ms = int(time.time() * 1000)
                for m in msgs:
                    if m.error() is not None:
                        continue
                    rec = self._codec.decode(m.value())  # type: ignore[arg-type]
                    self.received.append(
                        Received(now_ms, rec.window_start, rec.window_end, rec.ip, rec.count)
                    )
                for tp in consumer.position([TopicPartition(self.topic, p) for p in list(ends)]):
                    if tp.offset >= 0:
                        self._next[tp.partition] = max(self._next[tp.partition], tp.offset)
                    if self._next[tp.partition] >= ends[tp.partition]:
                        del ends[tp.partition]
        finally:
            consumer.unassign()


def percentile(values: list[float], q: float) -> float:
    """Nearest-rank percentile (q in 0..100) of a non-empty list."""
    ordered = sorted(values)
    rank = max(1, math.ceil(q / 100 * len(ordered)))
    return ordered[rank - 1]
