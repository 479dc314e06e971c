"""`ipcount consume` and `ipcount verify` as subprocesses against sink topics written by the sink's
transactional code (plus a deliberately aborted transaction for the read_uncommitted contrast)."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
import uuid
from collections.abc import Callable
from pathlib import Path

import pytest
from confluent_kafka import Producer

from ipcount.config import Settings
from ipcount.formats.avro import IpCount, SingleObjectCodec
from ipcount.kafka.client import with_client_logging
from ipcount.kafka.topics import ensure_topics
from ipcount.sink.producer_config import TxnConfig
from ipcount.sink.transaction import TxnSession
from ipcount.verify.ledger import Ledger

ROOT = Path(__file__).resolve().parents[3]
CODEC = SingleObjectCodec()
W = 5000
T0 = 1_700_000_000_000


def _cli(settings: Settings, *args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    sets = [
        f"kafka.bootstrap_servers={settings.kafka.bootstrap_servers}",
        f"topics.sink={settings.topics.sink}",
        f"topics.progress={settings.topics.progress}",
        f"topics.late={settings.topics.late}",
    ]
    cmd = [sys.executable, "-m", "ipcount", "-c", str(ROOT / "conf" / "ipcount.toml")]
    for item in sets:
        cmd += ["--set", item]
    env = {k: v for k, v in os.environ.items() if not k.startswith("IPCOUNT_")}
    return subprocess.run(
        [*cmd, *args], capture_output=True, text=True, timeout=timeout, cwd=ROOT, env=env
    )


def _commit(settings: Settings, batches: list[list[IpCount]]) -> None:
    qid = f"q-{uuid.uuid4().hex[:8]}"
    session = TxnSession(
        TxnConfig(
            topic=settings.topics.sink,
            progress_topic=settings.topics.progress,
            query_id=qid,
            transactional_id=f"ipcount-{qid}",
            producer_conf=settings.kafka.to_librdkafka("producer"),
            consumer_conf=settings.kafka.to_librdkafka("consumer"),
        )
    )
    for batch_id, results in enumerate(batches):
        records = [(r.ip.encode(), CODEC.encode(dataclasses.asdict(r))) for r in results]
        assert session.commit_batch(batch_id, records).status == "committed"


def _aborted(settings: Settings, results: list[IpCount]) -> None:
    """Write `results` in a transaction that is aborted after they reached the broker."""
    producer = Producer(
        with_client_logging(
            {
                **settings.kafka.to_librdkafka("producer"),
                "transactional.id": f"aborter-{uuid.uuid4().hex[:8]}",
            }
        )
    )
    producer.init_transactions(10)
    producer.begin_transaction()
    for r in results:
        producer.produce(settings.topics.sink, CODEC.encode(dataclasses.asdict(r)), r.ip.encode())
    producer.flush(10)
    producer.abort_transaction(10)


def _results(window: int, ips: list[str], base: int = 1) -> list[IpCount]:
    start = T0 + window * W
    return [IpCount(start, start + W, ip, base + i) for i, ip in enumerate(ips)]


def _ledger_files(tmp_path: Path, results: list[IpCount]) -> list[str]:
    """The truth for `results`, split over two ledger files (verify merges them)."""
    files = []
    for part in (0, 1):
        ledger = Ledger(window_ms=W)
        for i, r in enumerate(results):
            if i % 2 == part:
                ledger.add(r.window_start, r.ip, r.count)
        path = tmp_path / f"ledger-{part}.jsonl"
        ledger.save(path)
        files += ["--ledger", str(path)]
    return files


@pytest.fixture
def sink_settings(make_settings: Callable[..., Settings]) -> Settings:
    settings = make_settings()
    ensure_topics(settings)
    return settings


def test_consume_round_trip_and_isolation(sink_settings: Settings) -> None:
    committed = _results(0, ["10.0.0.1", "10.0.0.2", "2001:db8::7"]) + _results(1, ["10.0.0.1"])
    _commit(sink_settings, [committed[:3], committed[3:]])
    aborted = _results(2, ["10.9.9.9", "10.9.9.8"])
    _aborted(sink_settings, aborted)

    out = _cli(sink_settings, "consume", "--from-beginning", "--json", "--idle-exit", "1")
    assert out.returncode == 0, out.stderr
    rows = [json.loads(line) for line in out.stdout.splitlines()]
    got = sorted(
        (IpCount(r["window_start"], r["window_end"], r["ip"], r["count"]) for r in rows), key=str
    )
    assert got == sorted(committed, key=str)
    assert all({"partition", "offset"} <= set(r) for r in rows)

    out = _cli(
        sink_settings,
        "consume",
        "--from-beginning",
        "--json",
        "--idle-exit",
        "1",
        "--read-uncommitted",
    )
    assert out.returncode == 0, out.stderr
    ips = sorted(json.loads(line)["ip"] for line in out.stdout.splitlines())
    assert ips == sorted(r.ip for r in committed + aborted)

    out = _cli(sink_settings, "consume", "--from-beginning", "--max-records", "2")
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert lines[0].split() == ["window_start", "window_end", "ip", "count", "partition", "offset"]
    assert len(lines) == 3
    assert "2023-11-14T22:13:20.000Z" in out.stdout or "2023-11-14T22:13:25.000Z" in out.stdout


def test_consume_reports_missing_topic(make_settings: Callable[..., Settings]) -> None:
    out = _cli(make_settings(), "consume", "--idle-exit", "0.5")
    assert out.returncode == 1
    assert "does not exist" in out.stderr and "ipcount topics create" in out.stderr


def test_verify_exact_and_discrepancies(sink_settings: Settings, tmp_path: Path) -> None:
    truth = _results(0, [f"10.0.1.{i}" for i in range(8)]) + _results(1, ["10.0.1.0", "10.0.1.1"])
    ledgers = _ledger_files(tmp_path, truth)
    _commit(sink_settings, [truth[:5], truth[5:]])
    _aborted(sink_settings, truth[:3])

    out = _cli(sink_settings, "verify", *ledgers)
    assert out.returncode == 0, out.stdout + out.stderr
    assert out.stdout.splitlines()[-1].endswith(
        "results=10 missing=0 duplicates=0 wrong=0 exact=true"
    )

    # What a read_uncommitted reader sees: the aborted copies are duplicates.
    out = _cli(sink_settings, "verify", "--read-uncommitted", *ledgers)
    assert out.returncode == 1
    assert out.stdout.splitlines()[-1].endswith(
        "results=10 missing=0 duplicates=3 wrong=0 exact=false"
    )
    assert "duplicate window_start=" in out.stdout

    # A second sink topic where one result is missing, one duplicated and one wrong.
    broken = dataclasses.replace(
        sink_settings,
        topics=dataclasses.replace(sink_settings.topics, sink=f"sink-b-{uuid.uuid4().hex[:8]}"),
    )
    ensure_topics(broken)
    wrong = dataclasses.replace(truth[2], count=truth[2].count + 1)
    _commit(broken, [[truth[0], truth[1], wrong, *truth[3:9]], [truth[0]]])  # truth[9] missing
    out = _cli(broken, "verify", *ledgers)
    assert out.returncode == 1
    lines = out.stdout.splitlines()
    assert lines[-1].endswith("results=9 missing=1 duplicates=1 wrong=1 exact=false"), lines[-1]
    text = "\n".join(lines[:-1])
    # These markers carry no watermark (no checkpoint): nothing can be open, and verify says so.
    assert " open=0 " in lines[-1] and "watermark unknown:" in text, text
    assert f"missing window_start={truth[9].window_start} ip={truth[9].ip}" in text
    assert f"duplicate window_start={truth[0].window_start} ip={truth[0].ip}" in text
    assert (
        f"wrong window_start={truth[2].window_start} ip={truth[2].ip}: count={wrong.count}" in text
    )


def test_verify_bad_ledger_is_an_error(sink_settings: Settings, tmp_path: Path) -> None:
    bad = tmp_path / "bad.jsonl"
    bad.write_text("not a ledger\n", encoding="utf-8")
    out = _cli(sink_settings, "verify", "--ledger", str(bad))
    assert out.returncode == 1 and "is not an ipcount ledger" in out.stderr


def test_follow_picks_up_records_committed_while_idle(sink_settings: Settings) -> None:
    """A tailing reader that has gone idle (partitions released to stop noida-db's empty-fetch
    spin) still gets every record committed later, and none from before it started."""
    import threading
    import time

    from ipcount.kafka.topic_reader import TopicReader

    _commit(sink_settings, [_results(0, ["10.0.3.1"])])
    later = [_results(1 + b, [f"10.0.3.{i}" for i in range(4)]) for b in range(2)]
    conf = sink_settings.kafka.to_librdkafka("consumer")
    with TopicReader(conf, sink_settings.topics.sink, from_beginning=False) as reader:

        def commit_later() -> None:
            time.sleep(1.5)  # the reader is idle by now
            _commit(sink_settings, later)

        writer = threading.Thread(target=commit_later)
        writer.start()
        got = [CODEC.decode(r.value) for r in reader.follow(idle_exit=2.5)]  # type: ignore[arg-type]
        writer.join()
    assert sorted(got, key=str) == sorted(later[0] + later[1], key=str)
