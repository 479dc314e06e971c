"""One verdict per record, whatever Spark's offset log keeps and wherever the job starts:

- an `--available-now` run of more counting batches than Spark keeps offset log entries of (the
  newest 100 by default, 20 here: spark.sql.streaming.minBatchesToRetain; the dead-letter query
  starts only after the counting query is done): a record that was "future" for the batch that
  read it is dead-lettered, not judged by the time of a later batch, for which it is not future;
- `startingOffsets=latest`: rejects produced in the job's first seconds, before the dead-letter
  query has started, are all dead-lettered.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from confluent_kafka import Producer

from ipcount.formats.accesslog import format_record
from ipcount.kafka.topic_reader import TopicReader
from ipcount.kafka.topics import ensure_topics
from ipcount.local_pipeline.children import JobProcess
from ipcount.verify.ledger import Ledger

ROOT = Path(__file__).resolve().parents[2]
SKEW_S = 10
START_MARGIN_S = 75
# Spark keeps the newest 20 offset log entries (not its default 100): fewer batches purge batch 0.
_RETAIN = ("--set", "spark.conf.spark.sql.streaming.minBatchesToRetain=20")
# Sized to purge batch 0 with ten batches to spare: 30 counting batches against the 20 kept (was
# 500 records, 50 batches: 20 more batches that showed nothing more).
RECORDS = 300
BATCHES = RECORDS // 10


def _dead_letters(settings) -> list:  # type: ignore[no-untyped-def]
    conf = settings.kafka.to_librdkafka("consumer")
    with TopicReader(conf, settings.topics.dead_letter) as reader:
        return list(reader.read_to_end(30))


def test_a_future_record_of_a_purged_batch_is_dead_lettered(
    make_settings, ipcount_env, tmp_path: Path, ipcount_cli
) -> None:  # type: ignore[no-untyped-def]
    settings = make_settings("topics.source_partitions=1")
    ensure_topics(settings)
    checkpoint = Path(settings.job.checkpoint_location)
    env = {
        "IPCOUNT_JOB_DEAD_LETTER": "true",
        "IPCOUNT_JOB_MAX_FUTURE_SKEW_SECONDS": str(SKEW_S),
        # 10 records a batch: RECORDS take BATCHES counting batches, so Spark's offset log keeps
        # only batches ~10 on when the dead-letter query starts (it keeps 20, see _RETAIN).
        "IPCOUNT_JOB_MAX_OFFSETS_PER_TRIGGER": "10",
    }
    ledger = Ledger(window_ms=5000)
    now = int(time.time() * 1000)
    t0 = (now - 120_000) // 5000 * 5000
    # Future for batch 0 (planned within START_MARGIN_S of now: the run's start-up, which took
    # over 25 s on a loaded CI machine once); no longer future for a batch planned after
    # `near - SKEW_S`, such as the oldest one Spark keeps at the end: the job is frozen right
    # after its batch 0 until then (asserted below, whatever the machine's speed; without the
    # freeze a fast run planned every batch before it).
    near = now + (SKEW_S + START_MARGIN_S) * 1000
    near_line = format_record("198.51.100.9", near).encode()
    producer = Producer({"bootstrap.servers": settings.kafka.bootstrap_servers, "linger.ms": 5})
    producer.produce(settings.topics.source, value=near_line)
    for n in range(RECORDS):
        ip, at = f"10.5.0.{n % 8}", t0 + (n // 20) * 1000
        producer.produce(settings.topics.source, value=format_record(ip, at))
        ledger.add(at, ip)
    assert producer.flush(30) == 0

    argv = [sys.executable, "-m", "ipcount", *_RETAIN, "run", "--available-now"]
    job = JobProcess(
        [*argv, "--close-all-windows"], tmp_path / "job.log", env=ipcount_env(settings, env),
        cwd=ROOT,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 240
        while "ipcount batch 0:" not in job.log_text():
            assert job.alive and time.monotonic() < deadline, job.log_tail()
            time.sleep(0.1)
        job.freeze()
        time.sleep(max(0.0, (near - SKEW_S * 1000) / 1000 + 1 - time.time()))
        job.thaw()
        deadline = time.monotonic() + 600
        while job.alive:
            assert time.monotonic() < deadline, job.log_tail()
            time.sleep(0.5)
    finally:
        job.thaw()
        job.terminate(timeout=60)
    text = job.log_text()
    assert job.returncode == 0, text[-3000:]
    lines = "\n".join(line for line in text.splitlines() if " batch " in line)
    assert f"ipcount batch {BATCHES - 1}:" in lines or f"ipcount batch {BATCHES}:" in lines, lines[
        -2000:
    ]
    # The counting query's first batch judged it future (not counted) ...
    assert " future=1 " in lines, lines[:3000]
    # ... batch 0's offset log entry is purged, and the oldest one kept was planned when the
    # record was no longer future: judged by that batch, it would be neither counted nor
    # dead-lettered.
    kept = sorted(int(p.name) for p in (checkpoint / "offsets").iterdir() if p.name.isdigit())
    assert kept and kept[0] > 0, kept[:5]
    entry = (checkpoint / "offsets" / str(kept[0])).read_text().splitlines()[1]
    planned = json.loads(entry)["batchTimestampMs"]
    assert planned > near - SKEW_S * 1000, (kept[0], planned, near)
    # ... so the dead letters must hold it: counted or dead-lettered, never neither.
    dead = _dead_letters(settings)
    assert [d.value for d in dead] == [near_line], [d.value[:80] for d in dead]
    ledger.save(tmp_path / "ledger.jsonl")
    verify = ipcount_cli(settings, "verify", "--ledger", str(tmp_path / "ledger.jsonl"), env=env)
    last = verify.stdout.strip().splitlines()[-1] if verify.stdout.strip() else verify.stderr
    assert verify.returncode == 0 and "exact=true" in last, last


def test_latest_dead_letters_the_rejects_of_the_first_seconds(
    make_settings, ipcount_env, tmp_path: Path
) -> None:  # type: ignore[no-untyped-def]
    settings = make_settings("topics.source_partitions=2", "job.trigger_interval_seconds=0.5")
    ensure_topics(settings)
    producer = Producer({"bootstrap.servers": settings.kafka.bootstrap_servers, "linger.ms": 5})
    # Before the job: not read at all under `latest`.
    producer.produce(settings.topics.source, value=b"old junk before the start")
    assert producer.flush(30) == 0
    env = ipcount_env(
        settings,
        {"IPCOUNT_JOB_DEAD_LETTER": "true", "IPCOUNT_JOB_STARTING_OFFSETS": "latest"},
    )
    log = tmp_path / "job.log"
    job = subprocess.Popen(
        [sys.executable, "-m", "ipcount", "run"],
        env=env,
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
        stderr=log.open("w"),
    )
    sent: list[bytes] = []

    def now_ms() -> int:
        return int(time.time() * 1000)

    try:
        deadline = time.monotonic() + 240
        # Access lines until the counting query has run its first batch (it has resolved
        # `latest` by then) ...
        while "ipcount batch 0:" not in log.read_text():
            assert job.poll() is None and time.monotonic() < deadline, log.read_text()[-3000:]
            producer.produce(settings.topics.source, value=format_record("10.5.1.1", now_ms()))
            producer.flush(10)
            time.sleep(0.5)
        # ... then rejects until the dead-letter query has run a batch: the first seconds a
        # user's job is up.
        n = 0
        while "ipcount-dead-letter batch 0:" not in log.read_text() or n < 20:
            assert job.poll() is None and time.monotonic() < deadline, log.read_text()[-3000:]
            line = f"junk {n} of the first seconds".encode()
            producer.produce(settings.topics.source, value=line, partition=n % 2)
            producer.flush(10)
            sent.append(line)
            n += 1
            time.sleep(0.2)
        # Everything sent is read: wait until the dead letters hold as many records.
        got: list[bytes] = []
        while time.monotonic() < deadline:
            got = [d.value for d in _dead_letters(settings)]
            if len(got) >= len(sent):
                break
            time.sleep(2)
    finally:
        if job.poll() is None:
            job.send_signal(signal.SIGTERM)
            try:
                job.wait(120)
            except subprocess.TimeoutExpired:
                os.kill(job.pid, signal.SIGKILL)
    assert sorted(got) == sorted(sent), (
        f"{len(sent) - len(set(sent) & set(got))} of {len(sent)} rejects of the first seconds "
        "never dead-lettered:\n" + log.read_text()[-2000:]
    )
