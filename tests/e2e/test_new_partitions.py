"""Partitions added to the source topic while the job runs (3 -> 6) are picked up from their
first offset and counted exactly, with no restart."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, NewPartitions

from ipcount.formats.accesslog import format_record
from ipcount.kafka.topics import ensure_topics
from ipcount.verify.ledger import Ledger

ROOT = Path(__file__).resolve().parents[2]


def test_partitions_added_during_a_live_run_are_counted_exactly(
    make_settings, ipcount_env, tmp_path: Path
) -> None:  # type: ignore[no-untyped-def]
    settings = make_settings("topics.source_partitions=3")
    ensure_topics(settings)
    bootstrap = settings.kafka.bootstrap_servers
    topic = settings.topics.source
    ledger = Ledger(window_ms=5000)
    log = tmp_path / "job.log"
    job = subprocess.Popen(
        [sys.executable, "-m", "ipcount", "run"],
        env=ipcount_env(settings, {"IPCOUNT_JOB_DEAD_LETTER": "true"}),
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
        stderr=log.open("w"),
    )

    def traffic(producer: Producer, partitions: int, seconds: float) -> None:
        until = time.monotonic() + seconds
        n = 0
        while time.monotonic() < until:
            at = int(time.time() * 1000)
            for p in range(partitions):
                ip = f"10.8.{p}.{n % 4}"
                producer.produce(topic, value=format_record(ip, at), partition=p)
                ledger.add(at, ip)
            n += 1
            producer.flush(10)
            time.sleep(0.2)
        assert producer.flush(30) == 0

    try:
        deadline = time.monotonic() + 300
        first = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5})
        while "ipcount batch 0:" not in log.read_text():
            assert job.poll() is None and time.monotonic() < deadline, log.read_text()[-3000:]
            traffic(first, 3, 0.5)
        traffic(first, 3, 5)
        admin = AdminClient({"bootstrap.servers": bootstrap})
        for fut in admin.create_partitions([NewPartitions(topic, 6)]).values():
            fut.result(30)
        second = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5})
        while len(second.list_topics(topic, timeout=10).topics[topic].partitions) < 6:
            time.sleep(0.5)
        traffic(second, 6, 15)
        last = int(time.time() * 1000)
        # Idle heartbeats close every window that holds data.
        ledger.save(tmp_path / "ledger.jsonl")
        closing = last - last % 5000 + 5000
        exact = ""
        while time.monotonic() < deadline:
            assert job.poll() is None, log.read_text()[-3000:]
            verify = subprocess.run(
                [
                    sys.executable,
                    "-m",
                    "ipcount",
                    "verify",
                    "--ledger",
                    str(tmp_path / "ledger.jsonl"),
                ],
                env=ipcount_env(settings),
                cwd=ROOT,
                capture_output=True,
                text=True,
                timeout=120,
            )
            out = verify.stdout.strip().splitlines()
            exact = out[-1] if out else verify.stderr
            if verify.returncode == 0 and "exact=true" in exact and " open=0 " in f" {exact} ":
                break
            if time.time() * 1000 > closing + 60_000:
                break
            time.sleep(3)
    finally:
        if job.poll() is None:
            job.send_signal(signal.SIGTERM)
            job.wait(120)
    assert "exact=true" in exact and " open=0 " in f" {exact} ", (
        exact + "\n" + log.read_text()[-2000:]
    )
    assert "10.8.5." in (tmp_path / "ledger.jsonl").read_text()
