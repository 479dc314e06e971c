"""The real Spark job end to end: exact counts, window boundaries, out-of-order and late records,
malformed lines, an idle partition, idle flush of the last windows, and restart from checkpoint."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

from confluent_kafka import Producer

from ipcount.config import RunMode, Settings
from ipcount.formats.accesslog import format_record
from ipcount.formats.avro import make_codec
from ipcount.job.pipeline import start_job
from ipcount.kafka.records import decode_records
from ipcount.kafka.topic_reader import TopicReader
from ipcount.kafka.topics import ensure_topics
from ipcount.observe.progress import summarize_progress
from ipcount.verify.ledger import Ledger

ROOT = Path(__file__).resolve().parents[2]
T0 = 1_795_341_600_000  # a multiple of 5000: window starts are T0 + k * 5000
A, B, C, D, E = "10.0.0.1", "10.0.0.2", "10.0.0.3", "10.0.0.4", "10.0.0.5"
# Non-canonical spellings: counted under their canonical IP (RFC 5952; IPv4-mapped -> IPv4).
V6 = "2001:DB8:0:0::1"
V6_CANONICAL = "2001:db8::1"
MAPPED_C = "::FFFF:10.0.0.3"


def _produce(settings: Settings, rows: list[tuple[int, str | bytes, int]]) -> None:
    """rows: (partition, ip or raw line, event offset ms from T0)."""
    p = Producer({"bootstrap.servers": settings.kafka.bootstrap_servers, "linger.ms": 5})
    for partition, ip, offset_ms in rows:
        ms = T0 + offset_ms
        value = ip if isinstance(ip, bytes) else format_record(ip, ms).encode()
        p.produce(settings.topics.source, value=value, partition=partition, timestamp=ms)
    assert p.flush(10) == 0


def _results(settings: Settings) -> Counter[tuple[int, str, int]]:
    """(window_start offset from T0, ip, count) -> how many times it was committed."""
    codec = make_codec("single-object")
    conf = settings.kafka.to_librdkafka("consumer")
    with TopicReader(conf, settings.topics.sink) as reader:
        out: Counter[tuple[int, str, int]] = Counter()
        for _, rec in decode_records(reader.read_to_end(30), codec):
            assert rec.window_end - rec.window_start == 5000
            out[(rec.window_start - T0, rec.ip, rec.count)] += 1
    return out


def _wait(query: Any, check: Any, want: Any, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    got = None
    while time.monotonic() < deadline:
        assert query.exception() is None, query.exception()
        got = check()
        if got == want:
            return
        time.sleep(0.5)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}: got {got}, want {want}")


def test_job_counts_exactly_with_event_time_rules(spark, make_settings) -> None:  # type: ignore[no-untyped-def]
    # No heartbeat may fire between the steps below: a heartbeat advances event time with idle
    # wall-clock time and would legitimately close the window the out-of-order record belongs to.
    # Interval 0 (every trigger admits records): processAllAvailable returns at the first trigger
    # that finds nothing to do, and a paced source (job.trigger_interval_seconds > 0) may hold
    # records that arrived within the interval.
    settings = make_settings(
        "job.trigger_interval_seconds=0",
        "job.idle_timeout_seconds=600",
        "topics.source_partitions=3",
    )
    ensure_topics(settings)
    # Batch 1. Partition 2 gets one record and then stays idle for the rest of the test.
    _produce(
        settings,
        [
            (0, A, 0),
            (0, A, 4_999),
            (0, A, 5_000),  # 5000 is the next window's first instant
            (1, B, 1_000),
            (1, B, 1_000),
            (1, B, 1_000),
            # A client-controlled $remote_user (HTTP Basic auth) holding "]" and a fake time: a
            # real nginx line, counted under its true time like any other.
            (1, format_record(B, T0 + 1_000, user="evil] [01/Jan/2000:00:00:00").encode(), 1_000),
            (1, V6, 2_000),
            (1, b"not an access record", 2_000),
            (1, format_record("999.1.1.1", T0).encode(), 2_000),
            (1, b"\xff\xfe" + format_record(B, T0).encode(), 2_000),
            (2, C, 3_000),
            (2, MAPPED_C, 3_500),
        ],
    )
    queries = start_job(spark, settings)
    query = queries.counts
    try:
        query.processAllAvailable()
        # Batch 2 moves max event time to 12 s; then 8 s is out of order but within the 5 s delay.
        _produce(settings, [(0, A, 12_000)])
        query.processAllAvailable()
        _produce(settings, [(1, D, 8_000)])
        query.processAllAvailable()
        # Max event time 30 s -> watermark 25 s; a record at 1 s is now late.
        _produce(settings, [(0, A, 30_000)])
        query.processAllAvailable()
        _produce(settings, [(1, E, 1_000)])
        query.processAllAvailable()
        progress = [summarize_progress(json.loads(p.json)) for p in query.recentProgress]
        assert sum(p["heartbeats"] for p in progress) == 0
    finally:
        for q in queries.all():
            q.stop()
    assert query.exception() is None
    expected = Counter(
        {
            (0, A.lower(), 2): 1,
            (5_000, A, 1): 1,
            (0, B, 4): 1,
            (0, V6_CANONICAL, 1): 1,
            (0, C, 2): 1,
            (5_000, D, 1): 1,
            (10_000, A, 1): 1,
            (30_000, A, 1): 1,
        }
    )
    # Restart on the same checkpoint with a short idle timeout: input has stopped, and heartbeats
    # must close the last window [30 s, 35 s) on their own, within about idle timeout + window +
    # delay plus a few triggers.
    settings = settings.replace("job", idle_timeout_seconds=1.0)
    queries = start_job(spark, settings)
    query = queries.counts
    try:
        stopped_at = time.monotonic()
        _wait(query, lambda: _results(settings), expected, 60, "the last window via heartbeats")
        flush_seconds = time.monotonic() - stopped_at
        assert flush_seconds < 45, flush_seconds
        assert sum(p["malformed"] for p in progress) == 3
        # E at 1 s arrived after [0 s, 5 s) was emitted: a correction, not a drop.
        assert sum(p["late"] for p in progress) == 1
        assert sum(p["dropped"] for p in progress) == 0
        assert (
            sum(p["records"] for p in progress) == 17
        )  # every record read, malformed ones included
        restarted = [summarize_progress(json.loads(p.json)) for p in query.recentProgress]
        assert sum(p["heartbeats"] for p in restarted) >= 1
        assert sum(p["records"] for p in restarted) == 0  # nothing read twice after the restart
    finally:
        for q in queries.all():
            q.stop()
    assert query.exception() is None


def test_ipcount_run_restarts_from_checkpoint_without_duplicates(
    make_settings, tmp_path: Path, ipcount_cli
) -> None:  # type: ignore[no-untyped-def]
    settings = make_settings()
    ensure_topics(settings)
    ledger = Ledger()
    ips = [f"192.168.0.{i}" for i in range(1, 9)] + ["fd00::1", "fd00::2"]

    def produce_round(start_ms: int, n: int) -> None:
        rows = []
        for i in range(n):
            ip = ips[i % len(ips)]
            offset = start_ms + (i * 37) % 20_000
            rows.append((i % 3, ip, offset))
            ledger.add(T0 + offset, ip)
        _produce(settings, rows)

    produce_round(0, 3_000)
    first = ipcount_cli(settings, "run", "--available-now")
    assert first.returncode == 0, first.stderr[-3000:]
    # A bounded run emits the windows its data closed and leaves the rest open for the next run.
    produce_round(60_000, 3_000)
    second = ipcount_cli(settings, "run", "--available-now")
    assert second.returncode == 0, second.stderr[-3000:]
    # A third run with nothing new, told the input is finished, closes the windows left open.
    third = ipcount_cli(settings, "run", "--available-now", "--close-all-windows")
    assert third.returncode == 0, third.stderr[-3000:]
    ledger.save(tmp_path / "ledger.jsonl")
    verify = ipcount_cli(
        settings, "verify", "--ledger", str(tmp_path / "ledger.jsonl"), timeout=120
    )
    progress_lines = "\n".join(
        line
        for run in (first, second, third)
        for line in run.stderr.splitlines()
        if " batch " in line
    )
    assert verify.returncode == 0, verify.stdout + verify.stderr + progress_lines
    last = verify.stdout.strip().splitlines()[-1]
    assert last.endswith("missing=0 duplicates=0 wrong=0 exact=true"), last
    assert f"results={len(ledger.counts)}" in last


def test_dead_letter_query_writes_each_malformed_record_once(spark, make_settings) -> None:  # type: ignore[no-untyped-def]
    settings = make_settings()  # dead letters are on by default
    ensure_topics(settings)
    bad = [
        b"not an access record",
        format_record("999.1.1.1", T0).encode(),
        b"\xff\xfe" + format_record(B, T0).encode(),
        b'1.2.3.4 - - [31/Dec/9999:23:59:59 -0100] "GET / HTTP/1.1" 200 1 "-" "-"',  # year 10000
    ]
    _produce(settings, [(0, A, 0), (1, B, 1_000)] + [(i % 3, raw, 0) for i, raw in enumerate(bad)])
    for _ in range(2):  # the second run has nothing new: nothing may be written twice
        queries = start_job(
            spark, settings, mode=RunMode(available_now=True, close_all_windows=True)
        )
        # Under AvailableNow the dead-letter query follows the counting query's planned batches,
        # so it starts once that query is done.
        assert queries.dead_letter is None and queries.pending is not None
        try:
            queries.await_available_now(240)
            assert queries.dead_letter is not None
            for q in queries.all():
                assert q.exception() is None, q.exception()
        finally:
            for q in queries.all():
                q.stop()
    conf = settings.kafka.to_librdkafka("consumer")
    with TopicReader(conf, settings.topics.dead_letter) as reader:
        got = sorted(rec.value for rec in reader.read_to_end(30))
    assert got == sorted(bad)
    assert _results(settings) == Counter({(0, A, 1): 1, (0, B, 1): 1})
    with TopicReader(conf, settings.topics.dead_letter) as reader:
        reasons = sorted(
            dict(rec.headers or [])["ipcount.reason"] for rec in reader.read_to_end(30)
        )
    assert reasons == [
        b"malformed: $remote_addr is not an IP address (nor unix:)",
        b"malformed: event time outside 0001-01-01T00:00:00Z..9999-12-31T23:59:59Z (Spark's "
        b"timestamp range)",
        b"malformed: not UTF-8",
        b"malformed: not a valid nginx combined-format line",
    ]


def test_ipcount_run_stops_cleanly_on_sigterm(make_settings) -> None:  # type: ignore[no-untyped-def]
    settings = make_settings("job.trigger_interval_seconds=0.5")
    ensure_topics(settings)
    _produce(settings, [(0, A, 0)])
    env = {
        **os.environ,
        "PYSPARK_PYTHON": sys.executable,
        "IPCOUNT_KAFKA_BOOTSTRAP_SERVERS": settings.kafka.bootstrap_servers,
        "IPCOUNT_TOPICS_SOURCE": settings.topics.source,
        "IPCOUNT_TOPICS_SINK": settings.topics.sink,
        "IPCOUNT_TOPICS_PROGRESS": settings.topics.progress,
        "IPCOUNT_TOPICS_LATE": settings.topics.late,
        "IPCOUNT_TOPICS_DEAD_LETTER": settings.topics.dead_letter,
        "IPCOUNT_JOB_CHECKPOINT_LOCATION": settings.job.checkpoint_location,
        "IPCOUNT_SPARK_MASTER": "local[2]",
    }
    proc = subprocess.Popen(
        [sys.executable, "-m", "ipcount", "run"],
        env=env,
        cwd=ROOT,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert proc.stderr is not None
    lines: list[str] = []
    try:
        deadline = time.monotonic() + 180
        for line in proc.stderr:
            lines.append(line)
            if "ipcount batch 0:" in line or time.monotonic() > deadline:
                break
        assert any("ipcount batch 0:" in line for line in lines), "".join(lines[-30:])
        proc.send_signal(signal.SIGTERM)
        _, rest = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, rest[-3000:]
    assert "received SIGTERM: stopping" in rest
