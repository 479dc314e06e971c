"""What `ipcount chaos` reads from Kafka right after a fault point killed the job, against a real
broker: the job's other transactions are still open then (tasks of other partitions, the
dead-letter query's), and the evidence must neither wait behind them nor misreport them."""

from __future__ import annotations

import dataclasses
import json
import time
import uuid
from collections.abc import Callable
from pathlib import Path

from confluent_kafka import Producer

from ipcount.chaos.check import crash_evidence
from ipcount.chaos.plan import AFTER_COMMIT
from ipcount.config import Settings
from ipcount.formats.avro import IpCount, SingleObjectCodec
from ipcount.kafka.topics import ensure_topics
from ipcount.sink.marker import ProgressMarker
from ipcount.sink.producer_config import TxnConfig, default_transactional_id
from ipcount.sink.task_commit import task_config
from ipcount.sink.transaction import TxnSession


def _config(settings: Settings) -> TxnConfig:
    qid = f"q-{uuid.uuid4().hex[:8]}"
    return TxnConfig(
        topic=settings.topics.sink,
        progress_topic=settings.topics.progress,
        query_id=qid,
        transactional_id=default_transactional_id(qid),
        producer_conf=settings.kafka.to_librdkafka("producer"),
        consumer_conf=settings.kafka.to_librdkafka("consumer"),
        retry_deadline_seconds=10.0,
        fault_points=False,
    )


def _results(batch: int) -> list[tuple[bytes, bytes]]:
    result = IpCount(batch * 5000, (batch + 1) * 5000, "10.0.0.1", 1)
    return [(result.ip.encode(), SingleObjectCodec().encode(dataclasses.asdict(result)))]


def _checkpoint(tmp_path: Path, query: str) -> Path:
    """A checkpoint as Spark leaves it for a query that has committed no batch yet."""
    checkpoint = tmp_path / "checkpoint"
    (checkpoint / "commits").mkdir(parents=True)
    (checkpoint / "metadata").write_text(json.dumps({"id": query}) + "\n", encoding="utf-8")
    return checkpoint


def _open_marker(cfg: TxnConfig, partition: int, batch: int) -> Producer:
    """A task killed with the job inside its transaction: its marker written, never committed."""
    tid = task_config(cfg, partition).transactional_id
    producer = Producer({**cfg.producer_conf, "transactional.id": tid})
    producer.init_transactions(10)
    producer.begin_transaction()
    marker = ProgressMarker(
        cfg.query_id, batch, records=0, topic=cfg.topic, transactional_id=tid,
        sink_partition=partition,
    )  # fmt: skip
    producer.produce(cfg.progress_topic, key=marker.key, value=marker.encode())
    assert producer.flush(10) == 0
    return producer


def test_a_commit_is_seen_past_the_open_transactions_the_kill_left_behind_it(
    make_settings: Callable[..., Settings], tmp_path: Path
) -> None:
    """Task 0 committed batch 1 and the fault point killed the job; task 1, mid-way through its
    own transaction of batch 1, died with it. The evidence says task 0's commit is in Kafka,
    at once, instead of waiting for task 1's transaction to end (it ends only when the restart
    fences it)."""
    settings = make_settings()
    ensure_topics(settings)
    cfg = _config(settings)
    assert TxnSession(task_config(cfg, 0)).commit_batch(1, _results(1)).status == "committed"
    killed = _open_marker(cfg, 1, 1)
    started = time.monotonic()
    evidence = crash_evidence(settings, _checkpoint(tmp_path, cfg.query_id), AFTER_COMMIT, 1)
    took = time.monotonic() - started
    killed.abort_transaction(10)
    assert evidence == "batch not in Spark's commit log, committed in Kafka (sink task 0)"
    assert took < 10, took


def test_a_commit_behind_an_earlier_open_transaction_is_left_to_the_end_of_the_run(
    make_settings: Callable[..., Settings], tmp_path: Path
) -> None:
    """Task 1 wrote its marker first and died before committing; task 0's commit came after it.
    No read_committed reader can see past task 1's open transaction until it ends, so the
    evidence says the marker is there and undecided (the end of the run confirms it), rather
    than 'NOT committed' or an unreadable topic."""
    settings = make_settings()
    ensure_topics(settings)
    cfg = _config(settings)
    killed = _open_marker(cfg, 1, 2)
    assert TxnSession(task_config(cfg, 0)).commit_batch(2, _results(2)).status == "committed"
    evidence = crash_evidence(settings, _checkpoint(tmp_path, cfg.query_id), AFTER_COMMIT, 2)
    killed.abort_transaction(10)
    assert evidence == (
        "batch not in Spark's commit log, marker in Kafka behind another task's open "
        "transaction, its commit confirmed at the end (sink task 0, 1)"
    )
