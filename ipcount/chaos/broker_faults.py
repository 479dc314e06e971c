"""The broker faults of a chaos run: restarts (also while a commit is in flight) and hangs
(a part of ipcount.chaos.runner's ChaosRunner, in the `ipcount chaos` process)."""

from __future__ import annotations

import os
import signal
import time
from typing import TYPE_CHECKING

from ipcount.chaos.plan import BROKER_COMMIT, BROKER_HANG, BROKER_RESTART
from ipcount.chaos.processes import last_committed_batch
from ipcount.chaos.runner_parts import RunnerParts
from ipcount.local_pipeline.children import JobProcess

if TYPE_CHECKING:
    pass

__all__ = ["BrokerFaults"]


class BrokerFaults(RunnerParts):
    """Broker restarts and hangs while the job runs; mixed into ChaosRunner, which provides the
    waiting, the events and the job starts."""

    def _broker_signal(self, kind: str) -> str:
        """SIGSTOP for a hang. A restart is SIGTERM on a broker that loses acknowledged writes
        when killed (noida-db); on one that does not (Apache Kafka), the first restart is a
        SIGKILL and they alternate from there."""
        if kind == BROKER_HANG:
            return "SIGSTOP"
        broker = self.env.broker
        if broker is None or not broker.durable_kill:
            return "SIGTERM"
        return (
            "SIGKILL"
            if self.report.signals("SIGKILL") <= self.report.signals("SIGTERM")
            else ("SIGTERM")
        )

    def _restart_broker(self, job: JobProcess, kind: str = BROKER_RESTART) -> JobProcess | None:
        """Restart (or hang) the broker while the job runs; the job if it carried on, else None.

        noida-db saves its state about once a second, so a kill -9 of it loses the acknowledged
        writes of the last second, and even a graceful stop was measured to lose a produce
        request in flight at that moment (2 acknowledged records of ~580 in 2 of 5 restarts; the
        idempotent producer then fails with a fatal OUT_OF_ORDER_SEQUENCE_NUMBER). Both are
        durability losses of that broker, which Apache Kafka does not have and no client can
        survive. So on noida-db the broker stops right after a micro-batch's commit, when the job
        has no transaction in flight; on Apache Kafka it is killed whenever it comes. Either way
        the generator is stopped first (it flushes and writes its ledger; a new one starts after
        the restart): records held in a producer while the broker is away would be late by the
        time they arrive. The job may still die meanwhile; the runner then restarts it.
        """
        if self.env.broker is None:
            return job
        how = self._broker_signal(kind)
        if kind == BROKER_COMMIT:
            return self._restart_broker_in_commit(job, how)
        job = self._ready_then_wait(job, kind, self.rng.uniform(0.5, 3.0))
        self.env.pause_synth()
        before = last_committed_batch(self.checkpoint)
        o = self.options
        if not self.env.broker.durable_kill:
            deadline = time.monotonic() + o.idle_timeout_seconds + 3 * o.trigger_interval_seconds
            deadline += 30
            while job.alive and last_committed_batch(self.checkpoint) == before:
                if time.monotonic() > deadline:
                    break
                time.sleep(0.02)
            before = last_committed_batch(self.checkpoint)
        down = self.env.restart_broker(how)
        return self._after_broker_restart(job, kind, how, before, down)

    def _freeze_writer(
        self, job: JobProcess, event: str
    ) -> tuple[JobProcess, tuple[int, int] | None]:
        """A job whose writer froze itself at the fault point it was armed with for `event`
        (started anew, armed, if the running one is not); (job, (batch, pid of the frozen
        writer)), or (job, None) when none froze in time (the job is then killed and a missed
        fault recorded)."""
        if job.armed != event:
            # The job running now was started for another fault, or its one freeze is used up:
            # a clean stop, then a job armed for this one.
            job.terminate()
            job = self._start_job(event)
        while True:
            job = self._ready(job, event)
            deadline = time.monotonic() + self.options.start_timeout_seconds + 120
            while job.alive and job.stopped_writer() is None and time.monotonic() < deadline:
                self._tick()
            if job.alive or job.stopped_writer() is not None:
                break
            job = self._unplanned_exit(job, event)
        frozen = job.stopped_writer()
        job.armed = None  # one freeze per job start (IPCOUNT_FAULTS_STATE)
        if frozen is None or not _wait_stopped(frozen[1], 30.0):
            # Never leave an armed job behind: it could freeze later with nobody to resume it.
            job.kill()
            self._event(event, None, "no commit froze in time: skipped", injected=False)
            return job, None
        return job, frozen

    def _restart_broker_in_commit(self, job: JobProcess, how: str) -> JobProcess | None:
        """Stop the broker the moment a commit request leaves the sink: the writer froze itself
        right before commit_transaction; it is resumed and the broker stopped at once."""
        job, frozen = self._freeze_writer(job, BROKER_COMMIT)
        if frozen is None:
            return None
        batch, pid = frozen
        self.env.pause_synth()  # the writer waits, frozen, inside its open transaction
        before = last_committed_batch(self.checkpoint)
        try:
            os.kill(pid, signal.SIGCONT)
        except ProcessLookupError:
            job.kill()
            self._event(BROKER_COMMIT, batch, "the frozen writer was gone: skipped", injected=False)
            self.env.resume_synth(more=self.faults_pending)
            return None
        time.sleep(self.rng.uniform(0.0, 0.02))
        down = self.env.restart_broker(how)
        return self._after_broker_restart(
            job, BROKER_COMMIT, how, before, down, f"batch {batch}'s commit in flight; "
        )

    def _after_broker_restart(
        self,
        job: JobProcess,
        kind: str,
        how: str,
        before: int | None,
        down: float,
        context: str = "",
    ) -> JobProcess | None:
        """Resume the generator and see whether the job carried on past the broker restart."""
        self.env.resume_synth(more=self.faults_pending)
        what = f"{context}{how}; broker away {down:.1f}s"
        deadline = time.monotonic() + self.options.start_timeout_seconds
        while job.alive and time.monotonic() < deadline:
            last = last_committed_batch(self.checkpoint)
            if last is not None and (before is None or last > before):
                recovered = time.monotonic() - deadline + self.options.start_timeout_seconds
                self._event(
                    kind,
                    last,
                    f"{what}; job carried on (next commit {recovered:.1f}s after)",
                    signal=how,
                    recovery_s=down + recovered,
                )
                return job
            self._tick()
        if job.alive:
            job.kill()
            outcome = "job made no progress after it: SIGKILLed and restarted"
        else:
            job.reap()
            outcome = f"job died (exit {job.returncode}, see {job.log_path.name}): restarted"
        self._event(kind, before, f"{what}; {outcome}", signal=how)
        return None


def _wait_stopped(pid: int, timeout: float) -> bool:
    """Whether process `pid` is (or within `timeout` becomes) stopped by a signal: the fault
    point writes its line before it sends itself SIGSTOP. False if it is gone."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as fh:
                state = fh.read().rsplit(")", 1)[-1].split()[0]
        except (OSError, IndexError):
            return False
        if state in ("T", "t"):
            return True
        time.sleep(0.02)
    return False
