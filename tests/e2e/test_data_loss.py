"""Data loss is decided once: retention deletes unread records of the source between two bounded
runs. With job.fail_on_data_loss = true (the default) the second run stops with one clear
message (topic, partition, lost offsets, how to go on) and exit 1, without restarts that cannot
bring the records back; with false it skips exactly the lost offsets, reports them, and counts
everything else exactly."""

from __future__ import annotations

import subprocess
import time
from pathlib import Path

from confluent_kafka import Producer, TopicPartition
from confluent_kafka.admin import AdminClient

from ipcount.formats.accesslog import format_record
from ipcount.kafka.topics import ensure_topics
from ipcount.verify.ledger import Ledger

FIRST, TOTAL, DELETED_BEFORE = 500, 4_500, 3_500


def _line(t0: int, n: int) -> tuple[str, int, bytes]:
    ip, at = f"10.6.0.{n % 10}", t0 + (n // 50) * 1000
    return ip, at, format_record(ip, at).encode()


def _lose_unread_records(settings, ipcount_cli, ledger: Ledger, env: dict[str, str]) -> None:  # type: ignore[no-untyped-def]
    """Run 1 reads offsets 0-499; then 4,000 more arrive and retention deletes 500-3499."""
    ensure_topics(settings)
    t0 = (int(time.time() * 1000) - 200_000) // 5000 * 5000
    producer = Producer({"bootstrap.servers": settings.kafka.bootstrap_servers, "linger.ms": 5})

    def produce(first: int, last: int) -> None:
        for n in range(first, last):
            ip, at, line = _line(t0, n)
            producer.produce(settings.topics.source, value=line, partition=0)
            if n < FIRST or n >= DELETED_BEFORE:
                ledger.add(at, ip)
        assert producer.flush(30) == 0

    produce(0, FIRST)
    first = ipcount_cli(settings, "run", "--available-now", env=env)
    assert first.returncode == 0, first.stderr[-3000:]
    produce(FIRST, TOTAL)
    admin = AdminClient({"bootstrap.servers": settings.kafka.bootstrap_servers})
    deleted = TopicPartition(settings.topics.source, 0, DELETED_BEFORE)
    for fut in admin.delete_records([deleted]).values():
        fut.result(30)


def test_data_loss_stops_the_job_at_once_then_false_skips_exactly_the_lost_offsets(
    make_settings, ipcount_cli, tmp_path: Path
) -> None:  # type: ignore[no-untyped-def]
    # One loss for both settings, as an operator meets them: the default stops the job; then
    # job.fail_on_data_loss = false on the same checkpoint goes on. The stopped run planned
    # nothing (the driver decides before Spark's offset log has the batch), so the second run
    # starts where the first bounded run ended, as a first run after the loss would.
    settings = make_settings("topics.source_partitions=1")
    env = {
        "IPCOUNT_JOB_DEAD_LETTER": "true",
        # Read tasks of 1,000 offsets: three of them find their whole range deleted.
        "IPCOUNT_JOB_MAX_RECORDS_PER_PARTITION": "1000",
    }
    ledger = Ledger(window_ms=5000)
    _lose_unread_records(settings, ipcount_cli, ledger, env)

    # job.fail_on_data_loss = true (the default): stopped at once, with one message.
    started = time.monotonic()
    second = ipcount_cli(settings, "run", "--available-now", env=env, timeout=300)
    took = time.monotonic() - started
    assert second.returncode == 1, second.stderr[-3000:]
    topic = settings.topics.source
    wanted = f"data loss: partition {topic}/0: offsets {FIRST}-{DELETED_BEFORE - 1} were deleted"
    assert wanted in second.stderr, second.stderr[-3000:]
    assert "job.fail_on_data_loss = false" in second.stderr
    # Decided once: no restart (a restart cannot bring deleted records back).
    assert "restarting the query" not in second.stderr, second.stderr[-3000:]
    stops = [line for line in second.stderr.splitlines() if "not restarting" in line]
    assert len(stops) == 1 and "DataLossError" in stops[0], stops
    assert took < 120, f"the run took {took:.0f} s to give up"

    # job.fail_on_data_loss = false: the lost offsets are skipped, reported, the rest counted.
    env["IPCOUNT_JOB_FAIL_ON_DATA_LOSS"] = "false"
    try:
        third = ipcount_cli(
            settings, "run", "--available-now", "--close-all-windows", env=env, timeout=240
        )
    except subprocess.TimeoutExpired as exc:
        raise AssertionError(f"the run never finished:\n{str(exc.stderr)[-3000:]}") from None
    assert third.returncode == 0, third.stderr[-3000:]
    lost = DELETED_BEFORE - FIRST
    # The driver names the lost offsets once; the read tasks skip exactly them.
    assert f"offsets {FIRST}-{DELETED_BEFORE - 1} were deleted" in third.stderr
    # The read tasks' count, as ipcount_source_lost_records_total has it.
    assert f"skipped {lost} offsets deleted before they were read" in third.stderr, third.stderr[
        -3000:
    ]
    ledger.save(tmp_path / "ledger.jsonl")
    verify = ipcount_cli(settings, "verify", "--ledger", str(tmp_path / "ledger.jsonl"), env=env)
    last = verify.stdout.strip().splitlines()[-1] if verify.stdout.strip() else verify.stderr
    assert verify.returncode == 0 and "exact=true" in last, last
