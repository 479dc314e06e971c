"""Event time a user can trust: periodic bounded runs lose nothing, and a clock from the future
(a line stamped 2099, a producer whose Kafka timestamps run ahead) neither is counted nor moves
the watermark; the future record goes to the dead-letter topic with its reason."""

from __future__ import annotations

import subprocess
import time
from pathlib import Path

from confluent_kafka import Producer

from ipcount.formats.accesslog import format_record
from ipcount.kafka.topic_reader import TopicReader
from ipcount.kafka.topics import ensure_topics
from ipcount.verify.ledger import Ledger

ROOT = Path(__file__).resolve().parents[2]
FUTURE_MS = 4_070_908_800_000  # 2099-01-01T00:00:00Z


def test_periodic_bounded_runs_and_future_clocks_lose_nothing(
    make_settings, tmp_path, ipcount_cli
) -> None:  # type: ignore[no-untyped-def]
    settings = make_settings("topics.source_partitions=2")
    ensure_topics(settings)
    ledger = Ledger(window_ms=5000)

    def cli(*args: str) -> subprocess.CompletedProcess[str]:
        return ipcount_cli(settings, *args, env={"IPCOUNT_JOB_DEAD_LETTER": "true"})

    # Event time starts two minutes ago, on a window boundary: within the future-skew bound.
    t0 = (int(time.time() * 1000) - 120_000) // 5000 * 5000
    producer = Producer({"bootstrap.servers": settings.kafka.bootstrap_servers, "linger.ms": 5})

    def produce(event_ms: int, ip: str, kafka_ms: int | None = None) -> None:
        line = format_record(ip, event_ms).encode()
        producer.produce(
            settings.topics.source,
            value=line,
            partition=event_ms % 2,
            timestamp=event_ms if kafka_ms is None else kafka_ms,
        )

    def round_of(first_second: int) -> None:
        # 10 event-seconds, 100 records per second (20 IPs), as a scheduled bounded run sees them.
        for second in range(first_second, first_second + 10):
            for i in range(100):
                ip = f"10.1.{second}.{i % 20}"
                produce(t0 + second * 1000, ip)
                ledger.add(t0 + second * 1000, ip)

    round_of(0)
    # A valid line from a clock in 2099: not counted, must not move the watermark.
    produce(FUTURE_MS, "203.0.113.99", kafka_ms=t0 + 9_000)
    # An on-time line whose producer stamps Kafka timestamps 40 minutes ahead: counted, and the
    # heartbeat must not start from its Kafka timestamp.
    produce(t0 + 9_000, "203.0.113.7", kafka_ms=int(time.time() * 1000) + 2_400_000)
    ledger.add(t0 + 9_000, "203.0.113.7")
    assert producer.flush(30) == 0
    first = cli("run", "--available-now")
    assert first.returncode == 0, first.stderr[-3000:]
    round_of(10)
    assert producer.flush(30) == 0
    second = cli("run", "--available-now")
    assert second.returncode == 0, second.stderr[-3000:]
    # Only now close what is still open (the input is finished, by the user's choice).
    final = cli("run", "--available-now", "--close-all-windows")
    assert final.returncode == 0, final.stderr[-3000:]

    ledger.save(tmp_path / "ledger.jsonl")
    verify = cli("verify", "--ledger", str(tmp_path / "ledger.jsonl"))
    progress = "\n".join(
        line
        for run in (first, second, final)
        for line in run.stderr.splitlines()
        if "batch" in line
    )
    last = verify.stdout.strip().splitlines()[-1] if verify.stdout.strip() else verify.stderr
    assert verify.returncode == 0 and last.endswith("exact=true"), last + "\n" + progress
    assert " future=1 " in progress, progress

    conf = settings.kafka.to_librdkafka("consumer")
    with TopicReader(conf, settings.topics.dead_letter) as reader:
        dead = list(reader.read_to_end(30))
    assert len(dead) == 1, dead
    assert dead[0].value == format_record("203.0.113.99", FUTURE_MS).encode()
    assert dead[0].headers is not None
    assert dict(dead[0].headers)["ipcount.reason"].startswith(b"future")
