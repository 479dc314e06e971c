"""Helpers for the loadgen integration tests: run the CLI, read a topic back, count it like the job."""

from __future__ import annotations

import os
import selectors
import signal
import subprocess
import sys
import time
import uuid
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from confluent_kafka import OFFSET_BEGINNING, Consumer, TopicPartition

from ipcount.config import Settings
from ipcount.formats.accesslog import ParseError, parse_record
from ipcount.kafka.client import with_client_logging
from ipcount.verify.ledger import window_start_ms

ROOT = Path(__file__).resolve().parents[3]
BIN = Path(sys.executable).parent


def loadgen_cmd(settings: Settings, *extra_sets: str) -> list[str]:
    """`loadgen` with the test's broker and source topic (global options only)."""
    exe = BIN / "loadgen"
    cmd = [str(exe)] if exe.exists() else [sys.executable, "-m", "loadgen.cli"]
    cmd += ["--config", str(ROOT / "conf" / "ipcount.toml")]
    for item in (
        f"kafka.bootstrap_servers={settings.kafka.bootstrap_servers}",
        f"topics.source={settings.topics.source}",
        *extra_sets,
    ):
        cmd += ["--set", item]
    return cmd


def clean_env() -> dict[str, str]:
    """The environment without IPCOUNT_* settings, so only the test's --set values apply."""
    return {k: v for k, v in os.environ.items() if not k.startswith("IPCOUNT_")}


def read_topic(
    settings: Settings, topic: str | None = None, timeout: float = 60.0
) -> list[tuple[bytes | None, bytes, int, int]]:
    """Every record of a topic: (key, value, timestamp ms, timestamp type)."""
    topic = topic or settings.topics.source
    conf = dict(settings.kafka.to_librdkafka("consumer"))
    conf.update(
        {
            "group.id": f"loadgen-test-{uuid.uuid4().hex[:8]}",
            "enable.auto.commit": "false",
            "auto.offset.reset": "earliest",
        }
    )
    consumer = Consumer(with_client_logging(conf))
    try:
        md = consumer.list_topics(topic, timeout=10)
        parts = [TopicPartition(topic, p, OFFSET_BEGINNING) for p in md.topics[topic].partitions]
        high = {tp.partition: consumer.get_watermark_offsets(tp, timeout=10)[1] for tp in parts}
        consumer.assign(parts)
        todo = {p for p, h in high.items() if h > 0}
        out: list[tuple[bytes | None, bytes, int, int]] = []
        deadline = time.monotonic() + timeout
        while todo:
            assert time.monotonic() < deadline, f"timed out reading {topic}: {len(out)} records"
            for msg in consumer.consume(10_000, 0.5):
                assert msg.error() is None, msg.error()
                ts_type, ts = msg.timestamp()
                out.append((msg.key(), msg.value(), ts, ts_type))
                if msg.offset() + 1 >= high[msg.partition()]:
                    todo.discard(msg.partition())
        return out
    finally:
        consumer.close()


@dataclass
class TopicCounts:
    """A topic's records counted by the job's rules."""

    counts: Counter[tuple[int, str]] = field(default_factory=Counter)
    malformed: int = 0
    records: int = 0


def count_like_the_job(
    records: list[tuple[bytes | None, bytes, int, int]],
    max_record_bytes: int,
    window_ms: int = 5000,
) -> TopicCounts:
    """Parse with the job's regexes; also checks key == IP and Kafka timestamp == event time."""
    result = TopicCounts()
    for key, value, ts, _ in records:
        result.records += 1
        if len(value) > max_record_bytes:
            result.malformed += 1
            continue
        try:
            rec = parse_record(value)
        except ParseError:
            result.malformed += 1
            continue
        assert ts == rec.event_ms, (ts, value[:80])
        assert key is not None and key.decode().lower() == rec.ip
        result.counts[(window_start_ms(rec.event_ms, window_ms), rec.ip)] += 1
    return result


def start_service(cmd: list[str], timeout: float = 30.0) -> tuple[subprocess.Popen[str], str]:
    """Start `loadgen ... serve` and return it with its base URL (from its first stdout line)."""
    proc = subprocess.Popen(
        cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=clean_env(), cwd=ROOT
    )
    assert proc.stdout is not None
    sel = selectors.DefaultSelector()
    sel.register(proc.stdout, selectors.EVENT_READ)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if sel.select(timeout=0.5):
            line = proc.stdout.readline()
            if "listening on " in line:
                return proc, line.split("listening on ", 1)[1].split()[0]
            if not line and proc.poll() is not None:
                break
    proc.kill()
    _, err = proc.communicate()
    raise AssertionError(f"service did not start: {err[-2000:]}")


def stop_service(proc: subprocess.Popen[str], timeout: float = 60.0) -> tuple[int, str, str]:
    """SIGTERM the service and wait: (exit code, rest of stdout, stderr)."""
    proc.send_signal(signal.SIGTERM)
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, err = proc.communicate()
        raise AssertionError(f"service ignored SIGTERM: {err[-2000:]}") from None
    return proc.returncode, out, err
