"""Fixtures of the end-to-end tests."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from confluent_kafka import Producer

from ipcount.formats.accesslog import format_record
from ipcount.verify.ledger import Ledger


class Feed:
    """Produces rounds of on-time records (10 IPs x 5 per event-second) and keeps the ledger."""

    def __init__(self, settings) -> None:  # type: ignore[no-untyped-def]
        self.settings = settings
        self.ledger = Ledger(window_ms=5000)
        self.t0 = (int(time.time() * 1000) - 200_000) // 5000 * 5000

    def round(self, first_second: int, last_second: int) -> None:
        producer = Producer({"bootstrap.servers": self.settings.kafka.bootstrap_servers})
        for second in range(first_second, last_second):
            for i in range(10):
                ip = f"10.2.0.{i}"
                for _ in range(5):
                    line = format_record(ip, self.t0 + second * 1000).encode()
                    producer.produce(self.settings.topics.source, value=line)
                self.ledger.add(self.t0 + second * 1000, ip, 5)
        assert producer.flush(30) == 0

    def verify(self, cli, tmp_path: Path) -> str:  # type: ignore[no-untyped-def]
        self.ledger.save(tmp_path / "ledger.jsonl")
        done = cli(self.settings, "verify", "--ledger", str(tmp_path / "ledger.jsonl"))
        return done.stdout.strip().splitlines()[-1] if done.stdout.strip() else done.stderr


@pytest.fixture(name="Feed")
def feed_class() -> type[Feed]:
    """`Feed(settings)`: rounds of on-time records into the source, with their ledger."""
    return Feed
