"""Late data kept, not dropped: a record that arrives after its window's result was emitted is
written to topics.late as a correction, in the same transaction as its batch's results, so that
final counts plus corrections equal the true totals, exactly once, through a kill -9 and replay."""

from __future__ import annotations

import json
import time
from collections import Counter
from pathlib import Path

from confluent_kafka import Producer

from ipcount.formats.accesslog import format_record
from ipcount.formats.avro import make_codec
from ipcount.kafka.topic_reader import TopicReader
from ipcount.kafka.topics import ensure_topics
from ipcount.verify.ledger import Ledger


def _next_batch_id(checkpoint: str) -> int:
    done = [int(p.name) for p in (Path(checkpoint) / "commits").iterdir() if p.name.isdigit()]
    return max(done) + 1


def test_late_records_become_corrections_exactly_once(make_settings, tmp_path, ipcount_cli) -> None:  # type: ignore[no-untyped-def]
    settings = make_settings("topics.source_partitions=2")
    ensure_topics(settings)
    ledger = Ledger(window_ms=5000)
    t0 = (int(time.time() * 1000) - 120_000) // 5000 * 5000
    producer = Producer({"bootstrap.servers": settings.kafka.bootstrap_servers, "linger.ms": 5})

    def produce(event_ms: int, ip: str, n: int = 1) -> None:
        for i in range(n):
            line = format_record(ip, event_ms).encode()
            producer.produce(settings.topics.source, value=line, partition=i % 2)

    def on_time(first_second: int, last_second: int) -> None:
        for second in range(first_second, last_second):
            for i in range(10):
                produce(t0 + second * 1000, f"10.1.0.{i}", 5)
                ledger.add(t0 + second * 1000, f"10.1.0.{i}", 5)

    # Round 1: 20 event-seconds. A bounded run emits the windows its data closed:
    # [t0, t0+5 s) and [t0+5 s, t0+10 s) (newest event t0+19 s, watermark delay 5 s).
    on_time(0, 20)
    assert producer.flush(30) == 0
    first = ipcount_cli(settings, "run", "--available-now")
    assert first.returncode == 0, first.stderr[-3000:]

    # Then records of those emitted windows arrive: a new client, and more of a counted one.
    produce(t0 + 2_000, "203.0.113.50", 30)
    ledger.add(t0 + 2_000, "203.0.113.50", 30)
    produce(t0 + 7_000, "10.1.0.3", 20)
    ledger.add(t0 + 7_000, "10.1.0.3", 20)
    on_time(20, 30)
    assert producer.flush(30) == 0

    # The first batch of the next run that writes anything is killed inside its open
    # transaction (SIGKILL), then replayed by the next run.
    first_batch = _next_batch_id(settings.job.checkpoint_location)
    faults = ",".join(f"sink.before_commit@{b}" for b in range(first_batch, first_batch + 4))
    killed = ipcount_cli(
        settings, "run", "--available-now", env={"IPCOUNT_FAULTS": faults}, own_group=True
    )
    assert killed.returncode != 0, killed.stderr[-3000:]
    final = ipcount_cli(settings, "run", "--available-now", "--close-all-windows")
    assert final.returncode == 0, final.stderr[-3000:]

    conf = settings.kafka.to_librdkafka("consumer")
    codec = make_codec(settings.sink.wire_format, "", settings.topics.late)
    with TopicReader(conf, settings.topics.late, topic_setting="topics.late") as reader:
        corrections = Counter()
        for rec in reader.read_to_end(30):
            c = codec.decode(rec.value)  # type: ignore[arg-type]
            assert c.window_end - c.window_start == 5000
            corrections[(c.window_start, c.ip)] += c.count
    assert corrections == {(t0, "203.0.113.50"): 30, (t0 + 5000, "10.1.0.3"): 20}

    # The progress lines count them as late= (a replayed batch's line replaces the first one).
    late_per_batch = {
        line.split(" batch ")[1].split(":")[0]: int(line.split(" late=")[1].split()[0])
        for run in (killed, final)
        for line in run.stderr.splitlines()
        if "ipcount batch " in line
    }
    assert sum(late_per_batch.values()) == 50, late_per_batch

    ledger.save(tmp_path / "ledger.jsonl")
    verify = ipcount_cli(settings, "verify", "--ledger", str(tmp_path / "ledger.jsonl"))
    last = verify.stdout.strip().splitlines()[-1] if verify.stdout.strip() else verify.stderr
    assert verify.returncode == 0 and last.endswith("exact=true"), last
    assert " corrections=2 " in last, last

    shown = ipcount_cli(
        settings, "consume", "--from-beginning", "--with-late", "--json", "--idle-exit", "3"
    )
    assert shown.returncode == 0, shown.stderr[-3000:]
    rows = [json.loads(line) for line in shown.stdout.splitlines()]
    totals = {(r["window_start"], r["ip"]): r["total"] for r in rows}
    assert totals[(t0 + 5000, "10.1.0.3")] == 25 + 20
    assert totals[(t0, "203.0.113.50")] == 30
    assert {r["kind"] for r in rows} == {"final", "late"}
