"""`loadgen synth` against the test broker: the ledger equals what a consumer counts, delivery
errors stay out of the ledger, rate control holds, a missing topic fails clearly."""

from __future__ import annotations

import re
import signal
import subprocess
import time
from collections import Counter
from pathlib import Path

import pytest
from confluent_kafka.admin import NewTopic
from test_bench_support import clean_env, count_like_the_job, loadgen_cmd, read_topic

from ipcount.config import Settings
from ipcount.kafka.client import admin_client
from ipcount.kafka.topics import ensure_topics
from ipcount.verify.ledger import Ledger


def _synth(
    settings: Settings, args: list[str], *sets: str, timeout: float = 120
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*loadgen_cmd(settings, *sets), "synth", *args],
        capture_output=True, text=True, env=clean_env(), timeout=timeout,
    )  # fmt: skip


def _summary(stdout: str) -> dict[str, str]:
    line = [ln for ln in stdout.splitlines() if ln.startswith("synth:")][-1]
    return dict(re.findall(r"(\w+)=([^\s]+)", line))


def test_ledger_equals_what_a_consumer_counts(settings: Settings, tmp_path: Path) -> None:
    ensure_topics(settings)
    ledger_file = tmp_path / "synth.jsonl"
    proc = _synth(
        settings,
        ["--count", "40000", "--ips", "500", "--ipv6-share", "0.3", "--late-fraction", "0.03",
         "--malformed-fraction", "0.03", "--seed", "7", "--ledger", str(ledger_file)],
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    summary = _summary(proc.stdout)
    assert summary["records"] == "40000" and summary["errors"] == "0"

    ledger = Ledger.load(ledger_file)
    topic = count_like_the_job(read_topic(settings), settings.job.max_record_bytes)
    assert topic.records == ledger.records == 40000
    assert topic.malformed == ledger.malformed == int(summary["malformed"]) > 0
    # Exact per (window, IP): on-time and late together are what the topic holds...
    assert topic.counts == ledger.counts + ledger.late_counts
    # ...and late records occupy windows of their own, an hour behind the on-time ones.
    on_time_windows = {w for w, _ in ledger.counts}
    late_windows = {w for w, _ in ledger.late_counts}
    assert late_windows and not late_windows & on_time_windows
    assert min(on_time_windows) - max(late_windows) >= 3_600_000
    assert 0.02 < ledger.late / 40000 < 0.04
    assert any(":" in ip for _, ip in ledger.counts)


def test_delivery_errors_stay_out_of_the_ledger(settings: Settings, tmp_path: Path) -> None:
    # The broker refuses records above the topic's max.message.bytes: the oversized malformed
    # records (--oversized-bytes raised to 200 kB here) fail delivery, asynchronously.
    admin = admin_client(settings.kafka.to_librdkafka("admin"))
    spec = NewTopic(settings.topics.source, 3, 1, config={"max.message.bytes": "150000"})
    for fut in admin.create_topics([spec]).values():
        fut.result(30)
    ledger_file = tmp_path / "synth.jsonl"
    proc = _synth(
        settings,
        [
            "--count",
            "20000",
            "--malformed-fraction",
            "0.002",
            "--seed",
            "3",
            "--ledger",
            str(ledger_file),
            "--oversized-bytes",
            "200000",
        ],
        "kafka.producer.batch.size=100000",
    )
    assert proc.returncode == 1, proc.stdout + proc.stderr
    summary = _summary(proc.stdout)
    failed = int(summary["errors"])
    assert failed > 0 and "MSG_SIZE_TOO_LARGE" in proc.stdout
    assert "record not delivered" in proc.stderr
    ledger = Ledger.load(ledger_file)
    assert ledger.records == 20000 - failed == int(summary["records"])
    topic = count_like_the_job(read_topic(settings), 200_000)
    assert topic.records == ledger.records
    assert topic.counts == ledger.counts and topic.malformed == ledger.malformed


def test_the_retired_max_record_bytes_changes_nothing(settings: Settings) -> None:
    """job.max_record_bytes is retired: a config that still sets it loads, as the job's does, and
    the records are the same (the oversized ones stay under the topic's limit)."""
    admin = admin_client(settings.kafka.to_librdkafka("admin"))
    spec = NewTopic(settings.topics.source, 3, 1, config={"max.message.bytes": "150000"})
    for fut in admin.create_topics([spec]).values():
        fut.result(30)
    proc = _synth(
        settings,
        ["--count", "5000", "--malformed-fraction", "0.01", "--seed", "3"],
        "job.max_record_bytes=200000",
        "kafka.producer.batch.size=100000",  # a record batch must fit max.message.bytes too
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    summary = _summary(proc.stdout)
    assert (summary["records"], summary["errors"]) == ("5000", "0"), proc.stdout
    assert max(len(value) for _, value, _, _ in read_topic(settings)) < 10_000


def test_rate_control(settings: Settings) -> None:
    ensure_topics(settings)
    rate, duration = 2000, 5
    proc = _synth(
        settings,
        ["--rate", str(rate), "--duration", str(duration), "--jitter-seconds", "0", "--ips", "50"],
    )
    assert proc.returncode == 0, proc.stderr
    summary = _summary(proc.stdout)
    assert int(summary["records"]) == rate * duration
    assert float(summary["seconds"]) == pytest.approx(duration, rel=0.05)

    records = read_topic(settings)
    assert len(records) == rate * duration
    # Kafka timestamps are the wall-clock event times: count records per second, and judge
    # the full seconds (the first and last are partial).
    per_second = Counter(ts // 1000 for _, _, ts, _ in records)
    seconds = sorted(per_second)
    interior = [per_second[s] for s in seconds[1:-1]]
    assert len(interior) >= duration - 2, per_second
    measured = sum(interior) / len(interior)
    assert abs(measured - rate) / rate <= 0.05, per_second
    print(f"rate control: target {rate}/s, per second {[per_second[s] for s in seconds]}")


def test_missing_topic_fails_with_a_clear_message(settings: Settings) -> None:
    proc = _synth(settings, ["--count", "10"])
    assert proc.returncode == 1
    assert "ipcount topics create" in proc.stderr
    assert settings.topics.source in proc.stderr
    assert "Traceback" not in proc.stderr


def test_jitter_beyond_the_watermark_is_refused_when_late_records_would_be_dropped(
    settings: Settings,
) -> None:
    # With late corrections on (the default) such records become corrections: see the unit test.
    proc = _synth(
        settings, ["--count", "10", "--jitter-seconds", "5"], "job.late_corrections=false"
    )
    assert proc.returncode == 1
    assert "job.watermark_delay_seconds" in proc.stderr
    assert "turn late corrections on" in proc.stderr


def test_sigterm_flushes_and_writes_the_ledger(settings: Settings, tmp_path: Path) -> None:
    ensure_topics(settings)
    ledger_file = tmp_path / "synth.jsonl"
    proc = subprocess.Popen(
        [*loadgen_cmd(settings), "synth", "--rate", "3000", "--ledger", str(ledger_file)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=clean_env(),
    )  # fmt: skip
    time.sleep(3)
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err  # an unbounded run ends this way
    assert "interrupted" in out
    ledger = Ledger.load(ledger_file)
    topic = count_like_the_job(read_topic(settings), settings.job.max_record_bytes)
    assert ledger.records == topic.records == int(_summary(out)["records"]) > 1000
    assert ledger.counts == topic.counts
