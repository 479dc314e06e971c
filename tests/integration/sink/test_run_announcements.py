"""Run announcements that do not pile up (issue #38): however often a query starts, the progress
topic keeps a bounded number of live keys for it once compacted, and the fencing decision (a
fence by another worker of this job vs by a newer job) stays right."""

from __future__ import annotations

import dataclasses
import json
import uuid
from collections.abc import Callable
from pathlib import Path

import pytest
from confluent_kafka import Producer

from ipcount.config import RunMode, Settings
from ipcount.errors import FatalKafkaError
from ipcount.formats.avro import SingleObjectCodec
from ipcount.kafka.topic_reader import TopicReader
from ipcount.kafka.topics import ensure_topics
from ipcount.sink.fencing import superseded_by
from ipcount.sink.producer_config import TxnConfig, default_transactional_id
from ipcount.sink.start_check import check_sink_history
from ipcount.sink.transaction import TxnSession

STARTS = 40


@pytest.fixture
def progress_settings(make_settings: Callable[..., Settings]) -> Settings:
    settings = make_settings()
    ensure_topics(settings)
    return settings


def _live_keys(settings: Settings, query_id: str) -> set[str]:
    """The keys of `query_id` compaction keeps: the newest record per key, tombstones dropped."""
    newest: dict[str, bytes | None] = {}
    conf = settings.kafka.to_librdkafka("consumer")
    with TopicReader(conf, settings.topics.progress, isolation="read_uncommitted") as reader:
        for rec in reader.read_to_end(20):
            key = (rec.key or b"").decode()
            if key.startswith(query_id):
                newest[key] = rec.value
    return {key for key, value in newest.items() if value is not None}


def _start(settings: Settings, query_id: str, checkpoint: Path) -> str:
    """What `ipcount run` does with the sink's history before its query starts; the run id."""
    _, run_id = check_sink_history(
        settings, query_id, str(checkpoint), settings.topics.sink, RunMode()
    )
    return run_id


def _config(settings: Settings, query_id: str, run_id: str, checkpoint: Path) -> TxnConfig:
    return TxnConfig(
        topic=settings.topics.sink,
        progress_topic=settings.topics.progress,
        query_id=query_id,
        run_id=run_id,
        transactional_id=default_transactional_id(query_id),
        producer_conf=settings.kafka.to_librdkafka("producer"),
        consumer_conf=settings.kafka.to_librdkafka("consumer"),
        retry_deadline_seconds=10.0,
    )


def _records(batch: int) -> list[tuple[bytes, bytes]]:
    codec = SingleObjectCodec()
    row = {"window_start": batch * 5000, "window_end": (batch + 1) * 5000, "ip": "10.0.0.1"}
    return [(b"10.0.0.1", codec.encode({**row, "count": 1}))]


def test_many_starts_leave_a_bounded_number_of_live_keys(
    progress_settings: Settings, tmp_path: Path
) -> None:
    query_id = f"q-{uuid.uuid4().hex[:8]}"
    runs = [_start(progress_settings, query_id, tmp_path / "ckpt") for _ in range(STARTS)]
    assert len(set(runs)) == STARTS
    live = _live_keys(progress_settings, query_id)
    assert 1 <= len(live) <= 2, sorted(live)


def test_announcements_of_earlier_versions_are_compacted_away(
    progress_settings: Settings, tmp_path: Path
) -> None:
    """A topic written by an ipcount that kept one key per start: the next start clears them."""
    query_id = f"q-{uuid.uuid4().hex[:8]}"
    producer = Producer(progress_settings.kafka.to_librdkafka("producer"))
    for i in range(5):
        run = f"000000000000{i}-legacy{i:02d}"
        body = {"kind": "run", "queryId": query_id, "runId": run}
        producer.produce(
            progress_settings.topics.progress,
            json.dumps(body).encode(),
            f"{query_id}#run#{run}".encode(),
        )
    assert producer.flush(10) == 0
    assert len(_live_keys(progress_settings, query_id)) == 5
    newest = _start(progress_settings, query_id, tmp_path / "ckpt")
    live = _live_keys(progress_settings, query_id)
    assert len(live) == 1, sorted(live)
    # The order of the earlier starts is kept: the newest start is after all of them.
    cfg = _config(progress_settings, query_id, "0000000000004-legacy04", tmp_path / "ckpt")
    TxnSession(dataclasses.replace(cfg, run_id=newest)).commit_batch(0, _records(0))
    assert superseded_by(cfg) == newest


def test_the_fence_decision_holds_after_many_starts(
    progress_settings: Settings, tmp_path: Path
) -> None:
    query_id = f"q-{uuid.uuid4().hex[:8]}"
    runs = [_start(progress_settings, query_id, tmp_path / "ckpt") for _ in range(STARTS)]
    first, before_last, last = runs[0], runs[-2], runs[-1]
    # The first start committed; then many starts came and went without committing.
    zombie = TxnSession(_config(progress_settings, query_id, first, tmp_path / "ckpt"))
    assert zombie.commit_batch(0, _records(0)).status == "committed"
    assert superseded_by(zombie.config) is None  # the newest commit is its own
    # The newest start commits: every older start, however old, is superseded by it ...
    newest = TxnSession(_config(progress_settings, query_id, last, tmp_path / "ckpt"))
    assert newest.commit_batch(1, _records(1)).status == "committed"
    for older in (first, runs[1], before_last):
        assert superseded_by(_config(progress_settings, query_id, older, tmp_path)) == last
    # ... the newest start itself is not (a fence there came from another worker of its job) ...
    assert superseded_by(newest.config) is None
    # ... and the zombie, fenced, stops for good.
    with pytest.raises(FatalKafkaError, match="fenced for good"):
        zombie.commit_batch(2, _records(2))
    assert newest.commit_batch(2, _records(2)).status == "committed"
