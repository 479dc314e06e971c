"""One verdict per record, and bounded runs that close exactly the windows holding data.

- The dead-letter query judges "future" by the batch time of the counting batch that read the
  record: a record near the skew bound is counted or dead-lettered, never neither (nor both),
  even when the dead-letter query runs long after the counting query (dead letters switched on
  later, or a query restarted).
- `--close-all-windows` closes the windows the run's records fall in, from their event times,
  not from the wall clock: a later run's newer records are on-time counts.
"""

from __future__ import annotations

import subprocess
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

SKEW_S = 10
START_MARGIN_S = 75


def _producer(settings) -> Producer:  # type: ignore[no-untyped-def]
    return Producer({"bootstrap.servers": settings.kafka.bootstrap_servers, "linger.ms": 5})


def _ok(done: subprocess.CompletedProcess[str]) -> subprocess.CompletedProcess[str]:
    assert done.returncode == 0, done.stderr[-3000:]
    return done


def _batch_lines(*runs: subprocess.CompletedProcess[str]) -> str:
    return "\n".join(line for run in runs for line in run.stderr.splitlines() if " batch " in line)


def test_a_record_near_the_skew_bound_is_counted_or_dead_lettered(
    make_settings, tmp_path: Path, ipcount_cli
) -> None:  # type: ignore[no-untyped-def]
    settings = make_settings(f"job.max_future_skew_seconds={SKEW_S}")
    skew = {"IPCOUNT_JOB_MAX_FUTURE_SKEW_SECONDS": str(SKEW_S)}
    ensure_topics(settings)
    ledger = Ledger(window_ms=5000)
    now = int(time.time() * 1000)
    t0 = (now - 60_000) // 5000 * 5000
    producer = _producer(settings)
    for second in range(10):
        for i in range(10):
            ip = f"10.3.0.{i}"
            producer.produce(settings.topics.source, value=format_record(ip, t0 + second * 1000))
            ledger.add(t0 + second * 1000, ip)
    # Ahead of any batch time of the first run by more than the bound, but not of a batch planned
    # once the clock has passed `near - SKEW_S`. The first run plans its batches within
    # START_MARGIN_S of now even on a loaded CI machine (there, JVM start and the first plan took
    # over 25 s once, so the record was within the bound of batch 0 and counted).
    near = (now // 1000 + SKEW_S + START_MARGIN_S) * 1000
    near_line = format_record("198.51.100.7", near).encode()
    producer.produce(settings.topics.source, value=near_line, timestamp=now)
    assert producer.flush(30) == 0

    # The counting query alone first (dead letters off, as a user might have run it so far).
    first = _ok(
        ipcount_cli(
            settings,
            "run",
            "--available-now",
            "--close-all-windows",
            env={"IPCOUNT_JOB_DEAD_LETTER": "false", **skew},
        )
    )
    assert " future=1 " in _batch_lines(first), _batch_lines(first)
    # Now the record would be within the bound of a fresh batch time.
    time.sleep(max(0.0, (near - SKEW_S * 1000 + 3_000) / 1000 - time.time()))
    second = _ok(
        ipcount_cli(
            settings,
            "run",
            "--available-now",
            "--close-all-windows",
            env={"IPCOUNT_JOB_DEAD_LETTER": "true", **skew},
        )
    )

    conf = settings.kafka.to_librdkafka("consumer")
    with TopicReader(conf, settings.topics.dead_letter) as reader:
        dead = list(reader.read_to_end(30))
    # The counting query judged it future: so must the dead letters (else it is hidden).
    assert [d.value for d in dead] == [near_line], _batch_lines(first, second)
    assert dict(dead[0].headers or [])["ipcount.reason"].startswith(b"future")
    ledger.save(tmp_path / "ledger.jsonl")
    verify = ipcount_cli(settings, "verify", "--ledger", str(tmp_path / "ledger.jsonl"), env=skew)
    last = verify.stdout.strip().splitlines()[-1] if verify.stdout.strip() else verify.stderr
    assert verify.returncode == 0 and "exact=true" in last, last


def test_close_all_windows_leaves_newer_records_on_time(
    make_settings, tmp_path: Path, ipcount_cli
) -> None:  # type: ignore[no-untyped-def]
    settings = make_settings()
    ensure_topics(settings)
    ledger = Ledger(window_ms=5000)
    t0 = (int(time.time() * 1000) - 300_000) // 5000 * 5000
    producer = _producer(settings)

    def produce(first_second: int, last_second: int) -> None:
        for second in range(first_second, last_second):
            for i in range(5):
                ip = f"10.4.0.{i}"
                producer.produce(
                    settings.topics.source, value=format_record(ip, t0 + second * 1000)
                )
                ledger.add(t0 + second * 1000, ip)
        assert producer.flush(30) == 0

    # A finished input: close every window its records fall in ([t0, t0 + 10 s)).
    produce(0, 9)
    first = _ok(ipcount_cli(settings, "run", "--available-now", "--close-all-windows"))
    # More input after all: newer records, in the windows from t0 + 10 s on.
    produce(10, 20)
    second = _ok(ipcount_cli(settings, "run", "--available-now", "--close-all-windows"))
    lines = _batch_lines(first, second)
    assert " late=0 " in lines, lines

    conf = settings.kafka.to_librdkafka("consumer")
    with TopicReader(conf, settings.topics.late) as reader:
        corrections = list(reader.read_to_end(30))
    assert corrections == [], "newer records became late corrections"
    got: Counter[tuple[int, str]] = Counter()
    with TopicReader(conf, settings.topics.sink) as reader:
        for _, rec in decode_records(reader.read_to_end(30), make_codec("single-object")):
            got[(rec.window_start - t0, rec.ip)] += rec.count
    assert got == Counter(
        {(w * 5000, f"10.4.0.{i}"): 4 if w == 1 else 5 for w in range(4) for i in range(5)}
    ), sorted(got.items())
    ledger.save(tmp_path / "ledger.jsonl")
    verify = ipcount_cli(settings, "verify", "--ledger", str(tmp_path / "ledger.jsonl"))
    last = verify.stdout.strip().splitlines()[-1] if verify.stdout.strip() else verify.stderr
    assert verify.returncode == 0 and "exact=true" in last, last
