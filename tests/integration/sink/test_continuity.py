"""A commit the broker acknowledged and then lost is found before the next batch is written on top
of it: the sink never leaves a silent hole in its output (the 28-minute chaos run's batch 26)."""

from __future__ import annotations

import dataclasses
import shutil
import uuid

import pytest

from ipcount.errors import SinkHistoryError
from ipcount.formats.avro import IpCount, SingleObjectCodec
from ipcount.kafka.consume import TopicReader
from ipcount.kafka.topics import ensure_topics
from ipcount.sink.txn import TxnSession
from ipcount.sink.txn_config import TxnConfig, default_transactional_id

pytestmark = pytest.mark.kafka

CODEC = SingleObjectCodec()
W = 5000


def _batch(batch: int) -> list[tuple[bytes, bytes]]:
    rows = [IpCount(batch * W, (batch + 1) * W, f"10.{batch}.0.{i}", i + 1) for i in range(5)]
    return [(r.ip.encode(), CODEC.encode(dataclasses.asdict(r))) for r in rows]


def test_a_lost_commit_is_found_before_the_next_batch_is_written(
    new_broker, make_settings, tmp_path
) -> None:  # type: ignore[no-untyped-def]
    broker = new_broker(tmp_path / "broker")
    broker.start(timeout=60)
    try:
        settings = make_settings(f"kafka.bootstrap_servers={broker.bootstrap}")
        ensure_topics(settings)
        qid = f"q-{uuid.uuid4().hex[:8]}"
        session = TxnSession(
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
        conf = settings.kafka.to_librdkafka("consumer")
        with TopicReader(conf, settings.topics.sink) as reader:
            windows = {CODEC.decode(r.value).window_start for r in reader.read_to_end(30)}  # type: ignore[arg-type]
        assert windows == {0}, windows
    finally:
        broker.stop()
