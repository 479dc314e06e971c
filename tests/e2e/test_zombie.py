"""Two job processes on one checkpoint at once (a "zombie" that was thought dead, and its
replacement): Spark does not lock a checkpoint across processes, so both run batches; Kafka's
fencing on the shared transactional.id and the sink's progress marker keep read_committed exact."""

from __future__ import annotations

import sys
import time
from pathlib import Path

from ipcount.chaos_job import (
    JobProcess,
    SynthProcess,
    child_env,
    last_committed_batch,
)
from ipcount.config import Settings
from ipcount.ledger import Ledger
from ipcount.topics import ensure_topics
from ipcount.verify import verify_sink

ROOT = Path(__file__).resolve().parents[2]
# Spark's own complaint when two processes write the same batch of one checkpoint.
SPARK_CONCURRENT = ("Concurrent update to the log", "Multiple streaming jobs detected")


def _cli(settings: Settings) -> list[str]:
    t, j = settings.topics, settings.job
    sets = [
        f"kafka.bootstrap_servers={settings.kafka.bootstrap_servers}",
        f"topics.source={t.source}",
        f"topics.sink={t.sink}",
        f"topics.progress={t.progress}",
        f"topics.late={t.late}",
        f"topics.dead_letter={t.dead_letter}",
        f"job.checkpoint_location={j.checkpoint_location}",
        f"job.idle_timeout_seconds={j.idle_timeout_seconds:g}",
        f"job.trigger_interval_seconds={j.trigger_interval_seconds:g}",
        "spark.master=local[2]",
        "spark.shuffle_partitions=2",
    ]
    return [
        "--config",
        str(ROOT / "conf" / "ipcount.toml"),
        *(a for s in sets for a in ("--set", s)),
    ]


def _wait(what: str, cond, timeout: float) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if cond():
            return
        time.sleep(0.5)
    raise AssertionError(f"timed out after {timeout:g}s waiting for {what}")


def test_zombie_job_is_fenced_and_output_stays_exact(make_settings, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    settings = make_settings("job.idle_timeout_seconds=3", "job.trigger_interval_seconds=1")
    ensure_topics(settings)
    cli = _cli(settings)
    checkpoint = Path(settings.job.checkpoint_location)
    run = [sys.executable, "-m", "ipcount", *cli, "run"]
    synth = SynthProcess(
        cli, count=2400, rate=20, seed=11, ips=50, late_fraction=0.0, malformed_fraction=0.002,
        ledger=tmp_path / "ledger.jsonl", log_path=tmp_path / "synth.log", env=child_env(),
    )  # fmt: skip
    jobs: list[JobProcess] = []
    try:
        older = JobProcess(run, tmp_path / "older.log", env=child_env(), name="older")
        jobs.append(older)
        _wait(
            "the first job's first commit",
            lambda: last_committed_batch(checkpoint) is not None,
            240,
        )
        assert older.alive, older.log_tail()
        newer = JobProcess(run, tmp_path / "newer.log", env=child_env(), name="newer")
        jobs.append(newer)
        # Both run on one checkpoint now. The newer job's first commit (init_transactions on the
        # shared transactional.id) fences the older one's producer; the older job stops at its
        # next commit. Spark itself may also notice two writers of one batch and stop either.
        _wait("one of the two jobs to stop", lambda: not (older.alive and newer.alive), 240)
        stopped = [j for j in jobs if not j.alive]
        for job in stopped:
            text = job.log_text()
            assert job.returncode != 0, text[-3000:]
            assert job.fenced() or any(s in text for s in SPARK_CONCURRENT), text[-3000:]
        _wait("the generator", lambda: not synth.alive, 240)
        assert synth.returncode == 0, synth.log_path.read_text()[-2000:]
        # Let the survivor finish the stream; if both stopped, a fresh start takes over.
        survivor = next((j for j in jobs if j.alive), None)
        if survivor is None:
            survivor = JobProcess(run, tmp_path / "third.log", env=child_env(), name="third")
            jobs.append(survivor)
        ledger = Ledger.load(tmp_path / "ledger.jsonl")

        def exact() -> bool:
            assert survivor.alive, survivor.log_tail()
            return verify_sink(settings, ledger, deadline_seconds=60).exact

        _wait("exact read_committed output", exact, 240)
    finally:
        for job in jobs:
            job.terminate(timeout=60)
        synth.stop()
    report = verify_sink(settings, ledger)
    assert report.exact, report.summary() + "\n" + "\n".join(report.examples)
    assert report.results == len(ledger.counts)
    print("zombie:", ", ".join(f"{j.name} exit {j.returncode} fenced={j.fenced()}" for j in jobs))
