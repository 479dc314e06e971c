"""The watermark cannot run ahead of the clock: a line stamped just inside
job.max_future_skew_seconds (now + 299 s with the default 300) among ordinary live traffic is
counted in its own window, but it must not move the watermark minutes ahead, which would turn
every ordinary record after it into a late correction. It leaves as a correction of its window
(the window has no final count yet), with the first window that closes after it arrived."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

from confluent_kafka import Producer

from ipcount.formats.accesslog import format_record
from ipcount.formats.avro import make_codec
from ipcount.kafka.records import decode_records
from ipcount.kafka.topic_reader import TopicReader
from ipcount.kafka.topics import ensure_topics
from ipcount.verify.ledger import Ledger

ROOT = Path(__file__).resolve().parents[2]
AHEAD_IP = "198.51.100.77"


def _read(settings, topic: str) -> Counter[tuple[int, str]]:  # type: ignore[no-untyped-def]
    got: Counter[tuple[int, str]] = Counter()
    conf = settings.kafka.to_librdkafka("consumer")
    with TopicReader(conf, topic) as reader:
        for _, rec in decode_records(reader.read_to_end(30), make_codec("single-object")):
            got[(rec.window_start, rec.ip)] += rec.count
    return got


def test_a_record_just_inside_the_future_skew_does_not_make_the_others_late(
    make_settings, ipcount_env, tmp_path: Path
) -> None:  # type: ignore[no-untyped-def]
    settings = make_settings("topics.source_partitions=2")
    ensure_topics(settings)
    skew_s = settings.job.max_future_skew_seconds
    producer = Producer({"bootstrap.servers": settings.kafka.bootstrap_servers, "linger.ms": 5})
    ledger = Ledger(window_ms=5000)
    log = tmp_path / "job.log"
    job = subprocess.Popen(
        [sys.executable, "-m", "ipcount", "run"],
        env=ipcount_env(settings, {"IPCOUNT_JOB_DEAD_LETTER": "true"}),
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
        stderr=log.open("w"),
    )

    def send(ip: str, at: int) -> None:
        producer.produce(settings.topics.source, value=format_record(ip, at), partition=at % 2)
        ledger.add(at, ip)

    ahead_at = 0
    try:
        deadline = time.monotonic() + 240
        while "ipcount batch 0:" not in log.read_text():
            assert job.poll() is None and time.monotonic() < deadline, log.read_text()[-3000:]
            # Ordinary live traffic while the job starts: stamped now.
            for i in range(5):
                send(f"10.7.0.{i}", int(time.time() * 1000))
            producer.flush(10)
            time.sleep(0.5)
        # One line from a clock 299 s ahead: inside the skew, so it counts ...
        ahead_at = int(time.time() * 1000) + int(skew_s * 1000) - 1000
        send(AHEAD_IP, ahead_at)
        # ... and 10 s more of ordinary traffic (two windows or three), which must stay on-time
        # counts: a watermark moved by the line from ahead would make all of it late.
        until = time.monotonic() + 10
        while time.monotonic() < until:
            for i in range(5):
                send(f"10.7.0.{i}", int(time.time() * 1000))
            producer.flush(10)
            time.sleep(0.5)
        assert producer.flush(30) == 0
        last_ordinary = int(time.time() * 1000)
        # Idle heartbeats close the ordinary windows (the last one within ~15 s of the traffic).
        closed = last_ordinary - last_ordinary % 5000 + 5000
        until = time.monotonic() + 90
        while time.monotonic() < until:
            assert job.poll() is None, log.read_text()[-3000:]
            if any(w + 5000 >= closed for w, _ in _read(settings, settings.topics.sink)):
                break
            time.sleep(2)
        time.sleep(3)
    finally:
        if job.poll() is None:
            job.send_signal(signal.SIGTERM)
            job.wait(120)
    text = log.read_text()
    batches = "\n".join(line for line in text.splitlines() if " batch " in line)
    results = _read(settings, settings.topics.sink)
    corrections = _read(settings, settings.topics.late)
    ordinary = {k: n for k, n in ledger.counts.items() if k[1] != AHEAD_IP}
    # Every ordinary record is an on-time count: its window's final result holds it, and no
    # ordinary record became a correction (the watermark stayed with the clock).
    wrong = {k: (results.get(k), n) for k, n in ordinary.items() if results.get(k) != n}
    assert not wrong, (sorted(wrong.items())[:10], batches[-3000:])
    assert [k for k in corrections if k[1] != AHEAD_IP] == [], sorted(corrections.items())[:10]
    # The line from ahead is counted once, in its own window: as a correction (its window has
    # no final count yet, and the watermark will not reach it for minutes), sent with the first
    # window that closed after it arrived.
    ahead_window = ahead_at - ahead_at % 5000
    assert corrections == Counter({(ahead_window, AHEAD_IP): 1}), sorted(corrections.items())
    assert all(ip != AHEAD_IP for _, ip in results), sorted(results.items())
    ledger.save(tmp_path / "ledger.jsonl")
    verify = subprocess.run(
        [sys.executable, "-m", "ipcount", "verify", "--ledger", str(tmp_path / "ledger.jsonl")],
        env=ipcount_env(settings),
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    last = verify.stdout.strip().splitlines()[-1] if verify.stdout.strip() else verify.stderr
    assert verify.returncode == 0 and "exact=true" in last, last
