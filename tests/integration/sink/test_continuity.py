"""A commit the broker acknowledged and then lost is found before the next batch is written on top
of it: the sink never leaves a silent hole in its output (the 28-minute chaos run's batch 26).
And the check stops no healthy job."""

from __future__ import annotations

import dataclasses
import shutil
import uuid

import pytest
from confluent_kafka import Producer

from ipcount.errors import SinkHistoryError
from ipcount.formats.avro import IpCount, SingleObjectCodec
from ipcount.kafka.topic_reader import TopicReader
from ipcount.kafka.topics import ensure_topics
from ipcount.sink.marker import ProgressMarker
from ipcount.sink.producer_config import TxnConfig, default_transactional_id
from ipcount.sink.transaction import TxnSession

pytestmark = pytest.mark.kafka

CODEC = SingleObjectCodec()
W = 5000


def _batch(batch: int) -> list[tuple[bytes, bytes]]:
    rows = [IpCount(batch * W, (batch + 1) * W, f"10.{batch}.0.{i}", i + 1) for i in range(5)]
    return [(r.ip.encode(), CODEC.encode(dataclasses.asdict(r))) for r in rows]


def _session(settings, qid: str) -> TxnSession:  # type: ignore[no-untyped-def]
    return TxnSession(
        TxnConfig(
            topic=settings.topics.sink,
            progress_topic=settings.topics.progress,
            query_id=qid,
            transactional_id=default_transactional_id(qid),
            producer_conf=settings.kafka.to_librdkafka("producer"),
            consumer_conf=settings.kafka.to_librdkafka("consumer"),
            retry_deadline_seconds=20.0,
        )
    )


def _open_transaction(settings, marker: ProgressMarker) -> tuple[Producer, list[int]]:  # type: ignore[no-untyped-def]
    """Another producer's transaction holding one record in the progress topic, left open."""
    other = Producer(
        {
            "bootstrap.servers": settings.kafka.bootstrap_servers,
            "transactional.id": f"other-{uuid.uuid4().hex[:8]}",
        }
    )
    other.init_transactions(20)
    other.begin_transaction()
    where: list[int] = []
    other.produce(
        settings.topics.progress,
        marker.encode(),
        marker.key,
        on_delivery=lambda err, msg: where.extend([msg.partition(), msg.offset()]),
    )
    other.flush(20)
    return other, where


def _sink_windows(settings) -> set[int]:  # type: ignore[no-untyped-def]
    conf = settings.kafka.to_librdkafka("consumer")
    with TopicReader(conf, settings.topics.sink) as reader:
        return {CODEC.decode(r.value).window_start for r in reader.read_to_end(30)}  # type: ignore[arg-type]


def test_a_commit_that_became_an_abort_is_found(make_settings) -> None:  # type: ignore[no-untyped-def]
    # A broker that acknowledged batch 1's commit and came back with its transaction aborted:
    # the marker's record is still in the log, but no read_committed reader will ever see it.
    settings = make_settings()
    ensure_topics(settings)
    qid = f"q-{uuid.uuid4().hex[:8]}"
    session = _session(settings, qid)
    assert session.commit_batch(0, _batch(0)).status == "committed"
    marker = ProgressMarker(qid, 1, records=5, topic=settings.topics.sink)
    other, where = _open_transaction(settings, marker)
    other.abort_transaction(20)
    session.last_committed = 1
    session.last_marker = marker.at(where[0], where[1])

    with pytest.raises(SinkHistoryError) as refused:
        session.commit_batch(2, _batch(2))
    text = str(refused.value)
    assert "the broker lost a committed batch" in text and "batch 1" in text, text
    assert "newest progress marker the broker now has for this query is batch 0" in text, text
    assert _sink_windows(settings) == {0}


def test_an_open_transaction_of_another_producer_does_not_stop_the_job(make_settings) -> None:  # type: ignore[no-untyped-def]
    # A zombie of another query left a transaction open on the shared progress topic before
    # this query's marker: read_committed readers are held back, but nothing is lost.
    settings = make_settings()
    ensure_topics(settings)
    session = _session(settings, f"q-{uuid.uuid4().hex[:8]}")
    assert session.commit_batch(0, _batch(0)).status == "committed"
    zombie, _ = _open_transaction(settings, ProgressMarker("zombie", 0))
    assert session.commit_batch(1, _batch(1)).status == "committed"  # its marker after the zombie's
    assert session.commit_batch(2, _batch(2)).status == "committed"
    zombie.abort_transaction(20)
    assert _sink_windows(settings) == {0, W, 2 * W}


def test_a_lost_commit_is_found_before_the_next_batch_is_written(
    new_broker, make_settings, tmp_path
) -> None:  # type: ignore[no-untyped-def]
    broker = new_broker(tmp_path / "broker")
    broker.start(timeout=60)
    try:
        settings = make_settings(f"kafka.bootstrap_servers={broker.bootstrap}")
        ensure_topics(settings)
        session = _session(settings, f"q-{uuid.uuid4().hex[:8]}")
        assert session.commit_batch(0, _batch(0)).status == "committed"
        # The broker's disk as it is before batch 1.
        broker.stop()
        shutil.copytree(tmp_path / "broker", tmp_path / "before")
        broker.start(timeout=60)
        assert session.commit_batch(1, _batch(1)).status == "committed"
        # The broker comes back from the older disk: batch 1's acknowledged commit is gone, while
        # the job's sink carries on with the same producer.
        broker.stop()
        shutil.rmtree(tmp_path / "broker")
        shutil.copytree(tmp_path / "before", tmp_path / "broker")
        broker.start(timeout=60)

        with pytest.raises(SinkHistoryError) as refused:
            session.commit_batch(2, _batch(2))
        text = str(refused.value)
        assert "the broker lost a committed batch" in text and "batch 1" in text, text

        # Nothing was written over the hole: batch 2's results are not in the sink.
        assert _sink_windows(settings) == {0}
    finally:
        broker.stop()


def test_the_check_keeps_its_client_across_batches(make_settings, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    # The check runs before every commit, the driver's and each sink task's: a new consumer per
    # check (two, with their threads and connections) was half of a commit's time on a local
    # broker. The session keeps one, and still sees what the broker holds.
    import ipcount.sink.continuity as continuity

    created: list[object] = []

    class Counted(continuity.Consumer):  # type: ignore[misc,name-defined]
        def __init__(self, *args: object, **kwargs: object) -> None:
            super().__init__(*args, **kwargs)
            created.append(self)

    monkeypatch.setattr(continuity, "Consumer", Counted)
    settings = make_settings()
    ensure_topics(settings)
    session = _session(settings, f"q-{uuid.uuid4().hex[:8]}")
    for batch in range(6):
        assert session.commit_batch(batch, _batch(batch)).status == "committed"
    assert len(created) == 1, f"{len(created)} consumers for 5 checks"
    session.close()
    assert _sink_windows(settings) == {b * W for b in range(6)}
