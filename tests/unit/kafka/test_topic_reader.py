"""TopicReader's idle back-off must not starve a slow fetch (injected fake consumer, no broker)."""

from __future__ import annotations

import time
from typing import Any

import pytest

from ipcount.kafka import topic_reader
from ipcount.kafka.quirks import NOIDA_DB, NONE
from ipcount.kafka.topic_reader import TopicReader

TOPIC = "sink"
END = 5


class _Msg:
    def __init__(self, offset: int) -> None:
        self._offset = offset

    def error(self) -> None:
        return None

    def topic(self) -> str:
        return TOPIC

    def partition(self) -> int:
        return 0

    def offset(self) -> int:
        return self._offset

    def key(self) -> bytes:
        return b"k"

    def value(self) -> bytes:
        return b"v%d" % self._offset

    def timestamp(self) -> tuple[int, int]:
        return (1, 1_000)

    def headers(self) -> None:
        return None


class _SlowFetchConsumer:
    """One partition holding END records, whose fetch needs `polls` consume() calls of continuous
    assignment to arrive (a broker answering with a big backlog slowly); assign() restarts it."""

    polls = 3

    def __init__(self, conf: dict[str, Any]) -> None:
        self.pos = 0
        self.waited = 0
        self.assigns = 0

    def list_topics(self, topic: str | None = None, timeout: float = 0) -> Any:
        part = type("P", (), {})()
        tmd = type("T", (), {"partitions": {0: part}, "error": None})()
        return type("M", (), {"topics": {TOPIC: tmd}})()

    def get_watermark_offsets(self, tp: Any, timeout: float = 0, cached: bool = False) -> Any:
        return (0, END)

    def assign(self, tps: list[Any]) -> None:
        self.assigns += 1
        self.pos = tps[0].offset
        self.waited = 0

    def unassign(self) -> None:
        self.waited = 0

    def consume(self, n: int, timeout: float) -> list[_Msg]:
        self.waited += 1
        if self.waited < self.polls or self.pos >= END:
            return []
        msgs = [_Msg(o) for o in range(self.pos, END)]
        self.pos = END
        return msgs

    def position(self, tps: list[Any]) -> list[Any]:
        return [type("TP", (), {"partition": 0, "offset": self.pos})()]

    def close(self) -> None:
        pass


def test_read_to_end_survives_fetches_slower_than_one_poll(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(topic_reader, "Consumer", _SlowFetchConsumer)
    monkeypatch.setattr(topic_reader.time, "sleep", lambda s: None)
    with TopicReader({"bootstrap.servers": "fake:9092"}, TOPIC, quirks=NOIDA_DB) as reader:
        records = list(reader.read_to_end(deadline_seconds=5))
        fake = reader._consumer
    assert [r.offset for r in records] == list(range(END))
    # The reader kept its assignment while records were waiting: one assign, no restarts.
    assert fake.assigns == 1


def test_an_idle_reader_still_lets_go_of_its_partitions(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(topic_reader, "Consumer", _SlowFetchConsumer)
    monkeypatch.setattr(topic_reader.time, "sleep", lambda s: None)
    with TopicReader({"bootstrap.servers": "fake:9092"}, TOPIC, quirks=NOIDA_DB) as reader:
        list(reader.read_to_end(deadline_seconds=5))
        assert reader.poll() == [] and not reader._assigned


def test_on_apache_kafka_an_idle_reader_keeps_its_partitions(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Apache Kafka holds an empty fetch open: releasing partitions there would only add latency.
    monkeypatch.setattr(topic_reader, "Consumer", _SlowFetchConsumer)
    monkeypatch.setattr(topic_reader.time, "sleep", lambda s: None)
    with TopicReader({"bootstrap.servers": "fake:9092"}, TOPIC, quirks=NONE) as reader:
        list(reader.read_to_end(deadline_seconds=5))
        assert reader.poll() == [] and reader._assigned


def test_caught_up_only_at_the_end_and_says_when_the_end_is_unknown(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from confluent_kafka import KafkaError, KafkaException

    from ipcount.errors import BrokerError

    monkeypatch.setattr(topic_reader, "Consumer", _SlowFetchConsumer)
    monkeypatch.setattr(topic_reader.time, "sleep", lambda s: None)
    with TopicReader({"bootstrap.servers": "fake:9092"}, TOPIC, quirks=NONE) as reader:
        assert not reader.caught_up()
        list(reader.read_to_end(deadline_seconds=5))
        assert reader.caught_up()

        def unreachable(*args: Any, **kwargs: Any) -> Any:
            raise KafkaException(KafkaError(KafkaError._TRANSPORT, "broker down"))

        monkeypatch.setattr(reader._consumer, "get_watermark_offsets", unreachable)
        reader.timeout = 0.3  # a broker down for good: retried (a leader move) until then
        with pytest.raises(BrokerError, match=rf"cannot query the end of {TOPIC}\[0\]"):
            reader.caught_up()


class _StalledProbe:
    """A consumer whose first watermark request was in flight while its process was stopped: it
    answers _TIMED_OUT once, after the whole timeout, then answers normally."""

    def __init__(self, timeouts: int) -> None:
        self.timeouts = timeouts
        self.calls: list[float] = []

    def list_topics(self, topic: str | None = None, timeout: float = 0) -> None:
        pass

    def get_watermark_offsets(self, tp: object, timeout: float, cached: bool) -> tuple[int, int]:
        from confluent_kafka import KafkaError, KafkaException

        self.calls.append(timeout)
        if len(self.calls) <= self.timeouts:
            time.sleep(0.2)  # the stop: the deadline passes while the request waits
            raise KafkaException(KafkaError(KafkaError._TIMED_OUT))
        return 3, 42


def test_an_offset_query_stalled_past_its_deadline_is_asked_once_more() -> None:
    from ipcount.errors import BrokerError
    from ipcount.kafka.topic_reader import partition_offsets

    probe = _StalledProbe(timeouts=1)
    assert partition_offsets(probe, "t", 0, timeout=0.1) == (3, 42)  # type: ignore[arg-type]
    assert len(probe.calls) == 2 and probe.calls[1] >= 0.1  # a fresh window, not 0.1 s left over
    # A broker that really does not answer: the second timeout is the answer.
    silent = _StalledProbe(timeouts=5)
    with pytest.raises(BrokerError, match="cannot query the end of t\\[0\\]"):
        partition_offsets(silent, "t", 0, timeout=0.1)  # type: ignore[arg-type]
    assert len(silent.calls) == 2
