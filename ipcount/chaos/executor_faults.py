"""The faults of a chaos run on a Spark standalone cluster (`--standalone-workers`): the sink's
fault points kill the executor that runs the sink task (armed in a running job through a file
the executors read), and random SIGKILLs of an executor; Spark re-runs the lost tasks on another
or a new executor, without a query restart (a part of ipcount.chaos.runner's ChaosRunner)."""

from __future__ import annotations

import os
import re
import time
from dataclasses import dataclass
from pathlib import Path

from ipcount.chaos.check import crash_evidence
from ipcount.chaos.cluster_faults import QUERY_RESTART_LINE
from ipcount.chaos.env import ChaosError
from ipcount.chaos.plan import AFTER_COMMIT, EXECUTOR_KILL
from ipcount.chaos.processes import fault_spec, last_committed_batch, last_planned_batch
from ipcount.chaos.runner_parts import RunnerParts
from ipcount.local_pipeline.children import JobProcess

__all__ = ["ExecutorFaults", "ExecutorFaultLine", "executor_fault_lines", "arm"]

# What ipcount.faults writes (IPCOUNT_FAULTS_LOG) before it kills an executor.
_LINE = re.compile(
    r"fault injection: (?P<point>[a-z_.]+)@(?P<batch>-?\d+): SIGKILL to executor pid "
    r"(?P<pid>\d+) .*\(sink partition (?P<partition>\d+|None)\)"
)
_WHY = {
    "sink.before_commit": "inside the task's open transaction (records produced, not committed)",
    AFTER_COMMIT: "after the task's Kafka commit, before it reported to the driver",
}


@dataclass(frozen=True)
class ExecutorFaultLine:
    """A fault point that killed an executor: which point, batch, executor JVM and sink task."""

    point: str
    batch: int
    executor_pid: int
    partition: int | None


def executor_fault_lines(path: Path) -> list[ExecutorFaultLine]:
    """The executor kills that fault points recorded in `path` (oldest first)."""
    try:
        text = path.read_text(encoding="utf-8", errors="replace")
    except FileNotFoundError:
        return []
    return [
        ExecutorFaultLine(
            m.group("point"),
            int(m.group("batch")),
            int(m.group("pid")),
            None if m.group("partition") == "None" else int(m.group("partition")),
        )
        for m in _LINE.finditer(text)
    ]


def arm(path: Path, spec: str) -> None:
    """Write the executors' fault spec (IPCOUNT_FAULTS_FILE) at once: a reader sees the old or
    the new text, never a half-written one ("" disarms)."""
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(spec, encoding="utf-8")
    os.replace(tmp, path)


class ExecutorFaults(RunnerParts):
    """Executor faults while the job runs on the run's standalone cluster; mixed into
    ChaosRunner. The job is never restarted for them: Spark must carry the batch through."""

    def _query_restarts(self, job: JobProcess) -> int:
        return job.log_text().count(QUERY_RESTART_LINE)

    def _await_commit(self, job: JobProcess, batch: int) -> JobProcess:
        """Wait (up to the start timeout) until Spark's commit log holds `batch`; the job then
        (restarted if it died meanwhile)."""
        deadline = time.monotonic() + self.options.start_timeout_seconds
        while time.monotonic() < deadline:
            last = last_committed_batch(self.checkpoint)
            if last is not None and last >= batch:
                break
            if not job.alive:
                job = self._unplanned_exit(job, None)
            self._tick()
        return job

    def _executor_fault(self, job: JobProcess, kind: str) -> JobProcess:
        """Arm fault point `kind` for the executors of the running job and wait until it kills
        the executor of a sink task; record it with what the retried task found."""
        env = self.env
        faults_log, faults_file = env.executor_faults_log, env.executor_faults_file
        if faults_log is None or faults_file is None:
            raise ChaosError(f"{kind} on executors needs --standalone-workers")
        job = self._ready(job, kind)
        seen = len(executor_fault_lines(faults_log))
        last = last_committed_batch(self.checkpoint)
        # Past the batch running now: the fault hits a batch planned after the arming.
        first = (last if last is not None else -1) + 2
        restarts = self._query_restarts(job)
        arm(faults_file, fault_spec(kind, first, self.options.fault_span))
        deadline = time.monotonic() + self.options.start_timeout_seconds + 120
        fired: ExecutorFaultLine | None = None
        try:
            while fired is None:
                lines = executor_fault_lines(faults_log)
                if len(lines) > seen:
                    fired = lines[seen]
                    break
                if time.monotonic() > deadline:
                    self._event(kind, None, "did not fire in time: skipped", injected=False)
                    return job
                if not job.alive:
                    job = self._unplanned_exit(job, kind)
                    restarts = 0
                self._tick()
        finally:
            arm(faults_file, "")
        at = time.monotonic()
        evidence = crash_evidence(env.settings, self.checkpoint, kind, fired.batch)
        before = job.pid
        job = self._await_commit(job, fired.batch)
        same = job.pid == before and job.alive
        took = time.monotonic() - at
        cost = self._query_restarts(job) - restarts if same else 0
        retried = (
            f"batch committed {took:.1f}s after, by the same job; query restarts {cost}"
            if same
            else f"the job died after it (see {job.log_path.name}): restarted"
        )
        self._event(
            kind,
            fired.batch,
            f"fired on an executor: SIGKILL of executor {fired.executor_pid} (sink task "
            f"{fired.partition}) {_WHY[kind]}; {retried}; {evidence}",
            recovery_s=took,
            query_restarts=cost,
            job_died=not same,
        )
        self.report.events[-1].partition = fired.partition
        return job

    def _kill_executor(self, job: JobProcess) -> JobProcess:
        """SIGKILL one worker's executor (JVM and Python workers) at a random moment of the
        running job; the worker starts a new one and Spark re-runs what it lost."""
        spark = self.env.spark
        if spark is None:
            raise ChaosError(f"{EXECUTOR_KILL} needs --standalone-workers")
        pause = self.rng.uniform(0.2, 2.0 + 3 * self.options.trigger_interval_seconds)
        job = self._ready_then_wait(job, EXECUTOR_KILL, pause)
        order = list(range(len(spark.workers)))
        self.rng.shuffle(order)
        deadline = time.monotonic() + 60
        victims: list[int] = []
        worker = ""
        while not victims and time.monotonic() < deadline:
            for i in order:
                victims, worker = spark.kill_executors(i), spark.workers[i].name
                if victims:
                    break
            else:
                self._tick()  # every executor is being replaced: wait for a new one
        planned = last_planned_batch(self.checkpoint)
        committed = last_committed_batch(self.checkpoint)
        if not victims:
            self._event(EXECUTOR_KILL, planned, "no executor to kill: skipped", injected=False)
            return job
        mid = planned is not None and planned != committed
        where = f"mid-batch (batch {planned} planned, not committed)" if mid else "between batches"
        restarts, at = self._query_restarts(job), time.monotonic()
        target = (planned if planned is not None else -1) + (0 if mid else 1)
        before = job.pid
        job = self._await_commit(job, target)
        same = job.pid == before and job.alive
        cost = self._query_restarts(job) - restarts if same else 0
        self._event(
            EXECUTOR_KILL,
            planned,
            f"SIGKILL of {worker}'s executor {where} (pids "
            f"{' '.join(map(str, victims))}); batch {target} committed "
            f"{time.monotonic() - at:.1f}s after; query restarts {cost}",
            recovery_s=time.monotonic() - at,
            query_restarts=cost,
            job_died=not same,
        )
        return job
