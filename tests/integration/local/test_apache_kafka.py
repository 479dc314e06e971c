"""Guarantees only a real Apache Kafka broker can show: its transaction.max.timeout.ms enforced at
start-up (seed 004), and a transaction that outlives the broker's timeout aborted by the broker
and recovered exactly. These tests start their own KRaft broker whatever IPCOUNT_TEST_BROKER is."""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from ipcount.config import Settings, load_settings
from ipcount.formats.avro import IpCount, SingleObjectCodec
from ipcount.kafka.topic_reader import TopicReader
from ipcount.kafka.topics import ensure_topics
from ipcount.local.broker import free_port
from ipcount.local.kraft import KafkaBroker
from ipcount.sink.producer_config import TxnConfig, default_transactional_id

ROOT = Path(__file__).resolve().parents[3]
CODEC = SingleObjectCodec()
BROKER_MAX_MS = 8000

if shutil.which("java") is None and not os.environ.get("JAVA_HOME") and not os.environ.get("CI"):
    pytest.skip("Apache Kafka tests need Java 17+ (not on this machine)", allow_module_level=True)

# A process that commits batches with the sink's transactional code (as Spark's sink does).
CHILD = r"""
import json, sys
from ipcount.sink.transaction import TxnSession
from ipcount.sink.producer_config import TxnConfig
session = TxnSession(TxnConfig(**json.loads(sys.argv[1])))
for batch_id, records in json.loads(sys.argv[2]):
    out = session.commit_batch(batch_id, [(bytes.fromhex(k), bytes.fromhex(v)) for k, v in records])
    print(f"batch {batch_id}: {out.status}", flush=True)
"""


@pytest.fixture(scope="module")
def kafka(tmp_path_factory: pytest.TempPathFactory) -> Iterator[KafkaBroker]:
    """Apache Kafka with a small transaction.max.timeout.ms, checked for timeouts every second."""
    broker = KafkaBroker(
        tmp_path_factory.mktemp("kraft"),
        "127.0.0.1",
        free_port(),
        transaction_max_timeout_ms=BROKER_MAX_MS,
        extra={"transaction.abort.timed.out.transaction.cleanup.interval.ms": "1000"},
    )
    broker.start(timeout=90)
    try:
        yield broker
    finally:
        broker.stop()


def _settings(kafka: KafkaBroker, tmp_path: Path, *overrides: str) -> Settings:
    tag = uuid.uuid4().hex[:8]
    return load_settings(
        ROOT / "conf" / "ipcount.toml",
        env={},
        overrides=[
            f"kafka.bootstrap_servers={kafka.bootstrap}",
            f"topics.source=src-{tag}",
            f"topics.sink=sink-{tag}",
            f"topics.progress=progress-{tag}",
            f"topics.late=late-{tag}",
            f"topics.dead_letter=dlq-{tag}",
            f"job.checkpoint_location={tmp_path / 'ckpt'}",
            *overrides,
        ],
    )


def test_job_with_transaction_timeout_above_the_brokers_maximum_stops_at_start(
    kafka: KafkaBroker, tmp_path: Path
) -> None:
    settings = _settings(kafka, tmp_path, "sink.transaction_timeout_ms=60000")
    ensure_topics(settings)
    sets = [
        a
        for o in (
            f"kafka.bootstrap_servers={kafka.bootstrap}",
            f"topics.source={settings.topics.source}",
            f"topics.sink={settings.topics.sink}",
            f"topics.progress={settings.topics.progress}",
            f"topics.late={settings.topics.late}",
            f"topics.dead_letter={settings.topics.dead_letter}",
            f"job.checkpoint_location={tmp_path / 'ckpt'}",
            "sink.transaction_timeout_ms=60000",
        )
        for a in ("--set", o)
    ]
    started = time.monotonic()
    done = subprocess.run(
        [sys.executable, "-m", "ipcount", *sets, "run", "--timeout", "60"],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=120,
        env={k: v for k, v in os.environ.items() if k != "IPCOUNT_CONFIG"},
    )
    assert done.returncode == 1, done.stdout + done.stderr
    error = done.stderr.strip().splitlines()[-1]
    assert "sink.transaction_timeout_ms = 60000 ms" in error
    assert f"transaction.max.timeout.ms ({BROKER_MAX_MS} ms)" in error
    # Refused before Spark started (no query, no checkpoint), within seconds.
    assert not (tmp_path / "ckpt").exists()
    assert time.monotonic() - started < 30


def _records(batch: int, n: int) -> list[tuple[str, str]]:
    out = []
    for i in range(n):
        r = IpCount(batch * 5000, (batch + 1) * 5000, f"10.{batch}.0.{i}", i + 1)
        out.append((r.ip.encode().hex(), CODEC.encode(dataclasses.asdict(r)).hex()))
    return out


def _state(pid: int) -> str:
    with open(f"/proc/{pid}/stat", encoding="ascii") as fh:
        return fh.read().split(")")[-1].split()[0]


def test_transaction_outliving_the_broker_timeout_is_aborted_and_recovered_exactly(
    kafka: KafkaBroker, tmp_path: Path
) -> None:
    """A writer frozen inside its open transaction (SIGSTOP at sink.before_commit) for longer than
    transaction.timeout.ms: the broker aborts the transaction, read_committed readers move on, and
    when the writer resumes, its batch is written once: never lost, never doubled."""
    settings = _settings(kafka, tmp_path)
    ensure_topics(settings)
    qid = f"q-{uuid.uuid4().hex[:8]}"
    cfg = TxnConfig(
        topic=settings.topics.sink,
        progress_topic=settings.topics.progress,
        query_id=qid,
        transactional_id=default_transactional_id(qid),
        producer_conf=settings.kafka.to_librdkafka("producer"),
        consumer_conf=settings.kafka.to_librdkafka("consumer"),
        transaction_timeout_ms=3000,
        retry_deadline_seconds=20.0,
    )
    batches = [[0, _records(0, 40)], [1, _records(1, 25)], [2, _records(2, 10)]]
    env = {**os.environ, "IPCOUNT_FAULTS": "sink.before_commit@1/stop"}
    child = subprocess.Popen(
        [sys.executable, "-c", CHILD, json.dumps(dataclasses.asdict(cfg)), json.dumps(batches)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    try:
        deadline = time.monotonic() + 60
        while _state(child.pid) != "T":
            assert child.poll() is None, child.communicate()
            assert time.monotonic() < deadline, "the writer never reached sink.before_commit@1"
            time.sleep(0.05)
        # Frozen with batch 1 inside an open transaction. The broker aborts it after 3 s (it
        # checks every second): a read_committed reader is then no longer held back.
        conf = settings.kafka.to_librdkafka("consumer")
        with TopicReader(conf, cfg.topic, isolation="read_committed") as reader:
            seen = [CODEC.decode(r.value) for r in reader.read_to_end(30)]  # type: ignore[arg-type]
        assert len(seen) == 40
        os.kill(child.pid, signal.SIGCONT)
        out, err = child.communicate(timeout=90)
    finally:
        if child.poll() is None:
            child.kill()
    assert child.returncode == 0, out + err
    assert out.split("\n")[:3] == ["batch 0: committed", "batch 1: committed", "batch 2: committed"]
    with TopicReader(conf, cfg.topic, isolation="read_committed") as reader:
        results = [CODEC.decode(r.value) for r in reader.read_to_end(30)]  # type: ignore[arg-type]
    keys = [(r.window_start, r.ip) for r in results]
    assert len(keys) == len(set(keys)) == 75
