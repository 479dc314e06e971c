"""Exactly-once under faults, automated (the `ipcount chaos` process): broker, topics, `loadgen
synth` and the Spark job as child processes; SIGKILLs, injected sink faults and broker restarts
while data flows; then verify with read_committed (exact) and read_uncommitted (the contrast)."""

from __future__ import annotations

import logging
import random
import shlex
import sys
import time
import uuid
from collections.abc import Callable
from pathlib import Path

from ipcount.broker import LocalBroker, free_port
from ipcount.chaos_job import (
    JobProcess,
    SynthProcess,
    batch_ids,
    child_env,
    fault_spec,
    last_committed_batch,
    last_planned_batch,
    progress_markers,
    query_id,
)
from ipcount.chaos_plan import (
    AFTER_COMMIT,
    BEFORE_COMMIT,
    BROKER_RESTART,
    INJECTED,
    JOB_EXIT,
    KILL,
    ChaosEvent,
    ChaosOptions,
    ChaosReport,
    plan_events,
)
from ipcount.config import Settings, load_settings
from ipcount.errors import IpcountError
from ipcount.ledger import Ledger
from ipcount.topics import ensure_topics
from ipcount.verify import VerifyReport, verify_sink

__all__ = ["ChaosError", "ChaosRunner", "run_chaos"]

logger = logging.getLogger(__name__)

_POLL = 0.25
# Unplanned job exits in a row (no batch committed in between) before the run gives up.
_MAX_EXITS_IN_A_ROW = 4
_WHY = {
    BEFORE_COMMIT: "killed inside the open transaction (records produced, not committed)",
    AFTER_COMMIT: "killed after the Kafka commit, before Spark's commit log",
}


class ChaosError(IpcountError):
    """The chaos run could not carry on (a job that never starts, a generator that fails)."""


class ChaosRunner:
    """One chaos run; `run()` returns its report. Prints nothing: faults go to `on_event`,
    progress notes to `on_note`."""

    def __init__(
        self,
        settings: Settings,
        options: ChaosOptions,
        on_event: Callable[[ChaosEvent], None] = lambda e: None,
        on_note: Callable[[str], None] = lambda s: None,
    ) -> None:
        options.validate()
        self.options = options
        seed = options.seed
        self.seed = seed if seed is not None else random.SystemRandom().randrange(2**31)
        self.rng = random.Random(self.seed)
        self.events = plan_events(options.kills, options.broker_restarts, self.rng)
        self.rate = options.effective_rate(len(self.events))
        self.tag = uuid.uuid4().hex[:8]
        self.run_dir = Path(options.work_dir).resolve() / f"run-{self.tag}"
        self.report = ChaosReport(self.seed, self.run_dir)
        self.base = settings
        self.on_event, self.on_note = on_event, on_note
        self.broker: LocalBroker | None = None
        self.own_broker = False
        self.job: JobProcess | None = None
        self.synths: list[SynthProcess] = []
        self.faults_pending = True
        self.synth_paused = False
        self.t0 = time.monotonic()
        self._exits_in_a_row = 0

    # --- set-up ---------------------------------------------------------------------------

    def _overrides(self, bootstrap: str) -> list[str]:
        o, t = self.options, self.tag
        return [
            f"kafka.bootstrap_servers={bootstrap}",
            f"topics.source=chaos-{t}-source",
            f"topics.sink=chaos-{t}-sink",
            f"topics.progress=chaos-{t}-progress",
            f"topics.late=chaos-{t}-late",
            f"topics.dead_letter=chaos-{t}-dead-letter",
            f"job.checkpoint_location={self.run_dir / 'checkpoint'}",
            f"job.idle_timeout_seconds={o.idle_timeout_seconds:g}",
            f"job.trigger_interval_seconds={o.trigger_interval_seconds:g}",
            # Small Spark for a 2-core machine: two task threads, two state stores per batch.
            "spark.master=local[2]",
            "spark.shuffle_partitions=2",
        ]

    def _setup(self) -> None:
        self.run_dir.mkdir(parents=True, exist_ok=True)
        if self.options.use_configured_broker:
            bootstrap = self.base.kafka.bootstrap_servers
            b = self.base.broker
            local = LocalBroker(b.data_dir, b.host, b.port)
            # Only the local [broker] (`ipcount broker start`) can be restarted from here.
            if local.status().running and local.bootstrap == bootstrap:
                self.broker = local
            elif BROKER_RESTART in self.events:
                self.on_note(f"{bootstrap} is not the local [broker]: broker restarts skipped")
                self.events = [e for e in self.events if e != BROKER_RESTART]
        else:
            self.broker = LocalBroker(self.run_dir / "broker", "127.0.0.1", free_port())
            self.broker.start(timeout=self.base.broker.start_timeout_seconds)
            self.own_broker = True
            bootstrap = self.broker.bootstrap
        sets = self._overrides(bootstrap)
        config = [] if self.base.source_path == "defaults" else ["--config", self.base.source_path]
        self.cli = [*config, *(a for s in sets for a in ("--set", s))]
        path = None if self.base.source_path == "defaults" else self.base.source_path
        self.settings = load_settings(path, overrides=sets, use_default_path=False)
        ensure_topics(self.settings)
        self.checkpoint = Path(self.settings.job.checkpoint_location)
        self.on_note(
            f"seed {self.seed}; broker {bootstrap}; topics chaos-{self.tag}-*; "
            f"run dir {self.run_dir}"
        )
        self.on_note("plan: " + (", ".join(self.events) or "no faults"))

    def _start_synth(self, count: int) -> None:
        o, k = self.options, len(self.synths) + 1
        self.synths.append(
            SynthProcess(
                self.cli,
                count=count,
                rate=self.rate,
                seed=self.seed + k - 1,
                ips=o.ips,
                late_fraction=o.late_fraction,
                malformed_fraction=o.malformed_fraction,
                ledger=self.run_dir / f"ledger-{k}.jsonl",
                log_path=self.run_dir / f"synth-{k}.log",
                env=child_env(),
            )
        )
        self.on_note(f"loadgen synth {k}: {count} records at {self.rate:.0f}/s from {o.ips} IPs")

    def _check_synth(self) -> None:
        """Fail on a failed generator; while faults remain, keep data flowing (fault points fire
        only in batches with output, and a kill of an idle job proves little)."""
        last = self.synths[-1]
        if last.alive or self.synth_paused:
            return
        if not last.ok:
            raise ChaosError(
                f"loadgen synth failed (status {last.returncode}): "
                f"{last.summary() or last.log_path.read_text(errors='replace')[-2000:]}"
            )
        remaining = self.options.records - sum(s.delivered() for s in self.synths)
        if remaining > 0:
            self._start_synth(remaining)
        elif self.faults_pending:
            self.on_note("traffic ran out before the last fault: more records")
            self._start_synth(max(100, int(self.rate * self.options.seconds_per_fault)))

    def _start_job(self, next_event: str | None) -> JobProcess:
        faults = armed = ""
        if next_event in INJECTED:
            last = last_committed_batch(self.checkpoint)
            # Past the batch a restart replays (last + 1): the fault hits a new batch, live.
            first = (last if last is not None else -1) + 2
            faults = fault_spec(next_event, first, self.options.fault_span)
            armed = f"; armed: {next_event} from batch {first}"
        self.report.job_starts += 1
        n = self.report.job_starts
        argv = [sys.executable, "-m", "ipcount", *self.cli, "run"]
        log = self.run_dir / f"job-{n}.log"
        job = JobProcess(argv, log, env=child_env(faults=faults, faults_log=log))
        job.committed_at_start = last_committed_batch(self.checkpoint)
        self.on_note(f"job start {n} (pid {job.pid}, log {log.name}){armed}")
        self.job = job
        return job

    # --- waiting --------------------------------------------------------------------------

    def _now(self) -> float:
        return time.monotonic() - self.t0

    def _tick(self) -> None:
        self._check_synth()
        time.sleep(_POLL)

    def _sleep_alive(self, job: JobProcess, seconds: float) -> None:
        end = time.monotonic() + seconds
        while time.monotonic() < end and job.alive:
            self._tick()

    def _ready(self, job: JobProcess, next_event: str | None) -> JobProcess:
        """Wait until the job has committed a batch since it started (restarting it if it dies)."""
        deadline = time.monotonic() + self.options.start_timeout_seconds
        while True:
            if not job.alive:
                job = self._unplanned_exit(job, next_event)
                deadline = time.monotonic() + self.options.start_timeout_seconds
                continue
            last = last_committed_batch(self.checkpoint)
            start = job.committed_at_start
            if last is not None and (start is None or last > start):
                self._exits_in_a_row = 0
                return job
            if time.monotonic() > deadline:
                raise ChaosError(
                    f"the job committed no batch within {self.options.start_timeout_seconds:g}s "
                    f"of starting; see {job.log_path}:\n{job.log_tail()}"
                )
            self._tick()

    def _ready_then_wait(self, job: JobProcess, kind: str, seconds: float) -> JobProcess:
        """A job that has committed a batch since it started and then ran `seconds` more."""
        while True:
            job = self._ready(job, kind)
            self._sleep_alive(job, seconds)
            if job.alive:
                return job

    # --- faults ---------------------------------------------------------------------------

    def _event(self, kind: str, batch: int | None, outcome: str, injected: bool = True) -> None:
        ev = ChaosEvent(round(self._now(), 1), kind, batch, outcome, injected)
        self.report.events.append(ev)
        logger.info("chaos event: %s", ev.line())
        self.on_event(ev)

    def _unplanned_exit(self, job: JobProcess, next_event: str | None) -> JobProcess:
        self._exits_in_a_row += 1
        job.reap()
        tail = job.log_tail(12)
        self._event(
            JOB_EXIT,
            last_planned_batch(self.checkpoint),
            f"job exited on its own (status {job.returncode}, see {job.log_path.name}): restarted",
        )
        logger.warning("job log tail:\n%s", tail)
        if self._exits_in_a_row >= _MAX_EXITS_IN_A_ROW:
            raise ChaosError(
                f"the job exited {self._exits_in_a_row} times in a row without committing a "
                f"batch; see {job.log_path}:\n{tail}"
            )
        return self._start_job(next_event)

    def _random_kill(self, job: JobProcess) -> None:
        pause = self.rng.uniform(0.2, 2.0 + 3 * self.options.trigger_interval_seconds)
        job = self._ready_then_wait(job, KILL, pause)
        job.kill()
        planned = last_planned_batch(self.checkpoint)
        if planned is not None and planned != last_committed_batch(self.checkpoint):
            outcome = f"SIGKILL mid-batch (batch {planned} planned, not committed)"
        else:
            outcome = "SIGKILL between batches"
        self._event(KILL, planned, f"{outcome}; exit {job.returncode}")

    def _await_fault(self, job: JobProcess, kind: str) -> None:
        """Wait for the armed fault point to kill the job (restarting it, armed again, if it
        exits otherwise); SIGKILL it and record a missed fault if the point never fires."""
        while True:
            deadline = time.monotonic() + self.options.start_timeout_seconds + 120
            while job.alive and time.monotonic() < deadline:
                self._tick()
            if job.alive:
                job.kill()
                self._event(kind, None, "did not fire in time: SIGKILLed instead", injected=False)
                return
            fired = job.fault_fired()
            if fired is not None and fired.point == kind:
                break
            job = self._unplanned_exit(job, kind)
        job.reap()
        self._exits_in_a_row = 0
        self._event(
            kind,
            fired.batch,
            f"fired: {_WHY[kind]}; exit {job.returncode}; {self._evidence(kind, fired.batch)}",
            injected=job.killed,
        )

    def _evidence(self, kind: str, batch: int) -> str:
        """What Spark's checkpoint and Kafka hold for the batch right after the crash."""
        logged = "in" if batch in batch_ids(self.checkpoint / "commits") else "not in"
        text = f"batch {logged} Spark's commit log"
        query = query_id(self.checkpoint)
        if query is None:
            return text
        try:
            if kind == AFTER_COMMIT:
                # No transaction is open after the commit: read_committed reads to the end.
                seen = progress_markers(self.settings, query, "read_committed")
                where = "committed in Kafka" if batch in seen else "NOT committed in Kafka"
            else:
                # read_committed would wait behind the open transaction: look at it uncommitted.
                seen = progress_markers(self.settings, query, "read_uncommitted")
                where = "marker in an open transaction" if batch in seen else "no marker in Kafka"
        except IpcountError as exc:
            return f"{text}; progress topic unreadable: {exc}"
        return f"{text}, {where}"

    def _restart_broker(self, job: JobProcess) -> JobProcess | None:
        """Stop and start the broker while the job runs; the job if it carried on, else None.

        A graceful stop (SIGTERM), at a quiet moment. noida-db saves its state about once a
        second, so a kill -9 of the broker loses the acknowledged writes of the last second, and
        even a graceful stop was measured to lose a produce request in flight at that moment
        (2 acknowledged records of ~580 in 2 of 5 restarts; the idempotent producer then fails
        with a fatal OUT_OF_ORDER_SEQUENCE_NUMBER). Both are durability losses of the broker,
        which a replicated Kafka cluster does not have and no client can survive. So the
        generator is stopped first (it flushes and writes its ledger; a new one starts after the
        restart) and the broker stops right after a micro-batch's commit, when the job has no
        transaction in flight. The job may still die meanwhile; the runner then restarts it.
        """
        if self.broker is None:
            return job
        job = self._ready_then_wait(job, BROKER_RESTART, self.rng.uniform(0.5, 3.0))
        self.synth_paused = True
        self.synths[-1].stop()
        before = last_committed_batch(self.checkpoint)
        deadline = time.monotonic() + self.options.start_timeout_seconds
        while job.alive and last_committed_batch(self.checkpoint) == before:
            if time.monotonic() > deadline:
                break
            time.sleep(0.02)
        before = last_committed_batch(self.checkpoint)
        t = time.monotonic()
        self.broker.stop()
        time.sleep(self.options.broker_downtime_seconds)
        self.broker.start(timeout=self.base.broker.start_timeout_seconds)
        down = time.monotonic() - t
        self.synth_paused = False
        self._check_synth()
        deadline = time.monotonic() + self.options.start_timeout_seconds
        while job.alive and time.monotonic() < deadline:
            last = last_committed_batch(self.checkpoint)
            if last is not None and (before is None or last > before):
                self._event(BROKER_RESTART, last, f"broker down {down:.1f}s; job carried on")
                return job
            self._tick()
        if job.alive:
            job.kill()
            outcome = "job made no progress after it: SIGKILLed and restarted"
        else:
            job.reap()
            outcome = f"job died (exit {job.returncode}, see {job.log_path.name}): restarted"
        self._event(BROKER_RESTART, before, f"broker down {down:.1f}s; {outcome}")
        return None

    # --- the run --------------------------------------------------------------------------

    def run(self) -> ChaosReport:
        """Run the whole chaos round (broker and processes are stopped whatever happens)."""
        try:
            self._setup()
            self._start_synth(self.options.records)
            self._faults()
            self._finish()
        finally:
            self._cleanup()
            self.report.seconds = self._now()
        return self.report

    def _faults(self) -> None:
        events = self.events
        job = self._start_job(events[0] if events else None)
        for i, kind in enumerate(events):
            after = events[i + 1] if i + 1 < len(events) else None
            if kind in INJECTED:
                self._await_fault(job, kind)
            elif kind == KILL:
                self._random_kill(job)
            else:
                survivor = self._restart_broker(job)
                if survivor is not None:
                    job = survivor  # it carried on through the broker restart
                    continue
            job = self._start_job(after)
        self.faults_pending = False

    def _finish(self) -> None:
        while any(s.alive for s in self.synths):
            self._keep_job_running()
            self._tick()
        self._check_synth()
        ledgers = [s.ledger for s in self.synths]
        ledger = Ledger.load_all(ledgers)
        self.report.records = ledger.records
        self.report.synth_summary = " | ".join(s.summary() for s in self.synths)
        self.report.verify_command = shlex.join(
            ["ipcount", *self.cli, "verify", *(a for p in ledgers for a in ("--ledger", str(p)))]
        )
        job_s = self.settings.job
        flush = self.options.idle_timeout_seconds + job_s.window_seconds
        flush += job_s.watermark_delay_seconds
        self.on_note(f"traffic done ({ledger.records} records); waiting for the last windows")
        deadline = time.monotonic() + flush + self.options.start_timeout_seconds
        while time.monotonic() < deadline:
            self._keep_job_running()
            report = self._verify(ledger, "read_committed", quiet=True)
            if report is not None and report.exact:
                break
            time.sleep(3)
        if self.job is not None:
            self.job.terminate()
        self.report.committed = self._verify(ledger, "read_committed")
        self.report.uncommitted = self._verify(ledger, "read_uncommitted")

    def _keep_job_running(self) -> None:
        if self.job is not None and not self.job.alive:
            self.job = self._unplanned_exit(self.job, None)

    def _verify(self, ledger: Ledger, isolation: str, quiet: bool = False) -> VerifyReport | None:
        try:
            return verify_sink(self.settings, ledger, isolation, deadline_seconds=60)
        except IpcountError as exc:
            if not quiet:
                raise
            logger.info("verify not yet possible: %s", exc)
            return None

    def _cleanup(self) -> None:
        if self.job is not None:
            self.job.terminate(timeout=30)
        for synth in self.synths:
            synth.stop()
        if self.broker is not None and self.own_broker:
            self.broker.stop()


def run_chaos(
    settings: Settings,
    options: ChaosOptions,
    on_event: Callable[[ChaosEvent], None] = lambda e: None,
    on_note: Callable[[str], None] = lambda s: None,
) -> ChaosReport:
    """Run one chaos round; see ChaosRunner."""
    return ChaosRunner(settings, options, on_event, on_note).run()
