"""`ipcount top` over a sink that sink tasks write, each its share of a micro-batch in its own
transaction: a window whose results are only partly committed (one task's share in, another's
not yet) is not shown until the query's marker says the whole batch is in, then shown whole."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

from confluent_kafka import Producer

from ipcount.config import Settings
from ipcount.formats.avro import IpCount, SingleObjectCodec
from ipcount.kafka.topics import ensure_topics
from ipcount.sink.marker import ProgressMarker

ROOT = Path(__file__).resolve().parents[3]
CODEC = SingleObjectCodec()
W = 5000
T0 = 1_700_000_000_000


def _produce(settings: Settings, results: list[IpCount], markers: list[ProgressMarker]) -> None:
    producer = Producer({"bootstrap.servers": settings.kafka.bootstrap_servers})
    for r in results:
        producer.produce(settings.topics.sink, CODEC.encode(dataclasses.asdict(r)), r.ip.encode())
    for m in markers:
        producer.produce(settings.topics.progress, m.encode(), m.key)
    assert producer.flush(10) == 0


def _shown(settings: Settings) -> dict[int, int]:
    """Each window `ipcount top --json` prints: its start -> its number of IPs."""
    cmd = [sys.executable, "-m", "ipcount", "-c", str(ROOT / "conf" / "ipcount.toml")]
    for key in ("sink", "late", "progress"):
        cmd += ["--set", f"topics.{key}={getattr(settings.topics, key)}"]
    cmd += ["--set", f"kafka.bootstrap_servers={settings.kafka.bootstrap_servers}", "top", "--json"]
    env = {k: v for k, v in os.environ.items() if not k.startswith("IPCOUNT_")}
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=60, cwd=ROOT, env=env)
    assert done.returncode == 0, done.stderr
    windows = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    return {w["window_start"]: w["ips"] for w in windows}


def test_a_window_is_shown_once_every_sink_task_committed_its_share(
    make_settings: Callable[..., Settings],
) -> None:
    settings = make_settings()
    ensure_topics(settings)
    sink = settings.topics.sink
    # Batch 0 closes windows 0 and 1 (watermark at window 1's end); batch 1 closes window 2.
    window = [
        [IpCount(T0 + w * W, T0 + (w + 1) * W, f"10.0.{w}.{i}", i + 1) for i in range(4)]
        for w in range(3)
    ]

    def task(batch: int, partition: int, results: list[IpCount]) -> ProgressMarker:
        return ProgressMarker(
            "q", batch, records=len(results), topic=sink, sink_partition=partition
        )

    def query(batch: int, records: int, watermark: int) -> ProgressMarker:
        return ProgressMarker("q", batch, records=records, topic=sink, watermark_ms=watermark)

    # Task 0 of batch 0 committed its half of windows 0 and 1; task 1 has not yet.
    share0 = window[0][:2] + window[1][:2]
    _produce(settings, share0, [task(0, 0, share0)])
    assert _shown(settings) == {}

    share1 = window[0][2:] + window[1][2:]
    _produce(settings, share1, [task(0, 1, share1), query(0, 8, T0 + 2 * W)])
    assert _shown(settings) == {T0: 4, T0 + W: 4}

    # Batch 1: both tasks in, the query's marker not yet: window 2 waits for it.
    _produce(settings, window[2], [task(1, 0, window[2][:2]), task(1, 1, window[2][2:])])
    assert _shown(settings) == {T0: 4, T0 + W: 4}
    _produce(settings, [], [query(1, 4, T0 + 3 * W)])
    assert _shown(settings) == {T0: 4, T0 + W: 4, T0 + 2 * W: 4}
