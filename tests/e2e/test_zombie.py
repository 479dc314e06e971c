"""Two job processes on one checkpoint at once. Spark does not lock a checkpoint across processes,
so nothing stops a second start; what keeps the output exact is Kafka: the shared
transactional.id fences the other writer, and the sink's progress marker skips batches already
committed. Spark's offset/commit logs also refuse a second writer of the same batch."""

from __future__ import annotations

import sys
import time
from pathlib import Path

from ipcount.chaos.processes import last_committed_batch, last_planned_batch
from ipcount.config import Settings
from ipcount.kafka.topics import ensure_topics
from ipcount.local_pipeline.children import JobProcess, SynthProcess, child_env
from ipcount.verify.compare import verify_sink
from ipcount.verify.ledger import Ledger

ROOT = Path(__file__).resolve().parents[2]
# Spark's complaint when a second process writes a batch id of the checkpoint's logs.
SPARK_CONCURRENT = "CONCURRENT_STREAM_LOG_UPDATE"


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


def _wait(what: str, cond, timeout: float, poll: float = 0.5) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if cond():
            return
        time.sleep(poll)
    raise AssertionError(f"timed out after {timeout:g}s waiting for {what}")


def _why_stopped(job: JobProcess) -> str:
    """'fenced' (the sink's FatalKafkaError), 'sink-history' (its commit found a newer batch of
    this query already in the sink: the other process got ahead) or 'spark-log' (Spark's
    concurrent-update check)."""
    text = job.log_text()
    assert not job.alive and job.returncode not in (0, None), f"{job.name}: {text[-3000:]}"
    if job.fenced():
        assert "FatalKafkaError" in text, text[-3000:]
        return "fenced"
    if "SinkHistoryError" in text and "If another process runs this query" in text:
        return "sink-history"
    assert SPARK_CONCURRENT in text, f"{job.name} stopped for another reason: {text[-3000:]}"
    return "spark-log"


def test_zombie_jobs_on_one_checkpoint_are_stopped_and_output_stays_exact(
    make_settings, tmp_path: Path
) -> None:  # type: ignore[no-untyped-def]
    settings = make_settings("job.idle_timeout_seconds=3", "job.trigger_interval_seconds=1")
    ensure_topics(settings)
    cli = _cli(settings)
    checkpoint = Path(settings.job.checkpoint_location)
    run = [sys.executable, "-m", "ipcount", *cli, "run"]

    def committed() -> int:
        return last_committed_batch(checkpoint) or 0

    # More records than needed: the generator is stopped (it writes its ledger) once both
    # phases are over, so data flows through them however slow the machine is.
    synth = SynthProcess(
        cli, count=20_000, rate=20, seed=11, ips=50, late_fraction=0.0, malformed_fraction=0.002,
        ledger=tmp_path / "ledger.jsonl", log_path=tmp_path / "synth.log", env=child_env(),
    )  # fmt: skip
    jobs: list[JobProcess] = []

    def start(name: str) -> JobProcess:
        job = JobProcess(run, tmp_path / f"{name}.log", env=child_env(), name=name)
        jobs.append(job)
        return job

    outcome: dict[str, str] = {}
    try:
        # Phase 1, the classic zombie: a job frozen mid-batch (GC pause, frozen VM, partition)
        # is given up for dead and replaced; then it wakes up and carries on with its batch.
        zombie = start("zombie")
        _wait("the first job's first commit", lambda: committed() >= 1, 300)
        mid_batch = lambda: (last_planned_batch(checkpoint) or -1) > committed()  # noqa: E731
        _wait("the first job to be inside a batch", mid_batch, 120, poll=0.02)
        zombie.freeze()
        frozen_at = last_planned_batch(checkpoint)
        successor = start("successor")
        # The successor replays the frozen batch and carries on; its first commit's
        # init_transactions fences the zombie's producer.
        _wait("the successor's commits", lambda: committed() >= (frozen_at or 0) + 2, 300)
        zombie.thaw()
        _wait("the zombie to stop", lambda: not zombie.alive, 180)
        outcome["zombie"] = _why_stopped(zombie)
        assert successor.alive, successor.log_tail()

        # Phase 2, two live jobs: a second start while the successor runs. Whichever writes a
        # batch id of the checkpoint second, or commits fenced after the other's marker, stops.
        mark = committed()
        twin = start("twin")
        _wait("one of the two live jobs to stop", lambda: not (twin.alive and successor.alive), 300)
        stopped = successor if not successor.alive else twin
        outcome[f"live {stopped.name}"] = _why_stopped(stopped)
        survivor = twin if stopped is successor else successor
        # Commits from here on are the survivor's alone (the stopped job may have committed a
        # batch the survivor was still running when it stopped: counted from the stop, not from
        # the twin's start, so that race ends below rather than after the wait).
        mark = committed()
        _wait(
            "the survivor to carry on (or stop too)",
            lambda: committed() >= mark + 3 or not survivor.alive,
            300,
        )
        if not survivor.alive:
            # Possible in a close race: the stopped job had committed a newer marker, so the
            # other stops at its next fenced commit. Safe (nothing written twice): restart.
            outcome[f"live {survivor.name}"] = _why_stopped(survivor)
            survivor = start("third")
            _wait("a fresh start to carry on", lambda: committed() >= mark + 3, 300)

        synth.stop()
        assert synth.ok, synth.log_path.read_text()[-2000:]
        ledger = Ledger.load(tmp_path / "ledger.jsonl")

        def exact() -> bool:
            nonlocal survivor
            if not survivor.alive:
                # The same close race, found one batch later: the survivor's in-flight batch had
                # been committed by the stopped job. Only a legitimate stop is accepted; restart.
                outcome[f"late {survivor.name}"] = _why_stopped(survivor)
                survivor = start("fourth")
            return verify_sink(settings, ledger, deadline_seconds=60).exact

        _wait("exact read_committed output", exact, 240, poll=3)
    finally:
        for job in jobs:
            job.thaw()
            job.terminate(timeout=60)
        synth.stop()
    report = verify_sink(settings, ledger)
    assert report.exact, report.summary() + "\n" + "\n".join(report.examples)
    assert report.results == len(ledger.counts)
    print("zombie outcome:", outcome, report.summary())
