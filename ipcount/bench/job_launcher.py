"""The job of a pipeline benchmark as a child process (ipcount.bench.timed_job), run from the
bench process: started, its process tree's memory sampled, stopped, its result file loaded."""

from __future__ import annotations

import contextlib
import json
import signal
import sys
import threading
import time
import uuid
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

from ipcount.bench.memory import CoresBusy, MemoryPeaks, MemorySampler, cores_busy
from ipcount.bench.report import (
    Sustained,
    batch_records,
    data_batch_spans,
    sustained,
    warm,
)
from ipcount.bench.workspace import BenchEnv
from ipcount.childproc import Child, spawn
from ipcount.errors import IpcountError
from ipcount.local_pipeline.children import child_env

__all__ = [
    "JobRun",
    "LaunchedJob",
    "start_job_child",
    "finish_job_child",
    "run_job_child",
    "stop_job_child",
    "sigterm_as_interrupt",
]


@dataclass
class JobRun:
    """One run of the job child: its result file, timings (epoch s) and memory."""

    status: int
    launched: float
    exited: float
    result: dict[str, Any]
    memory: MemoryPeaks
    log: Path
    progress: list[dict[str, Any]] = field(default_factory=list)

    @property
    def startup_s(self) -> float:
        """Process launch until the SparkSession is ready (JVM, imports, session)."""
        return float(self.result["session_ready"]) - self.launched

    @property
    def run_s(self) -> float:
        """Query start until run_job returned: every window committed (AvailableNow)."""
        return float(self.result["run_ended"]) - float(self.result["run_started"])

    @property
    def query_init_s(self) -> float | None:
        """Query start until its first micro-batch began (preflight checks, the query's start,
        Spark's Python data source processes, initial offsets)."""
        if not self.progress or not self.progress[0].get("timestamp"):
            return None
        began = datetime.fromisoformat(str(self.progress[0]["timestamp"])).timestamp()
        return began - float(self.result["run_started"])

    @property
    def launch_to_visible_s(self) -> float:
        """Job process launch (its interpreter's start) until the run ended: with AvailableNow,
        every window committed, i.e. visible to read_committed readers."""
        start = self.result.get("process_start", self.launched)
        return float(self.result["run_ended"]) - float(start)

    @property
    def sustained(self) -> Sustained | None:
        """Steady-state throughput, the first data batch excluded (None: < 2 data batches)."""
        return sustained(self.result.get("events", []))

    @property
    def warm(self) -> Sustained | None:
        """Throughput of the later half of the data batches (None: < 4 data batches)."""
        return warm(self.result.get("events", []))

    def cores_busy(self, steady: bool) -> CoresBusy | None:
        """Mean cores busy on the machine while the counting query's data batches ran (steady:
        the first left out), with the broker's share; None without samples or batches."""
        spans = data_batch_spans(self.result.get("events", []), steady)
        return cores_busy(self.memory.timeline, spans)

    @property
    def first_batch_s(self) -> float | None:
        """Query start until the first micro-batch with input finished."""
        for ev in self.result.get("events", []):
            if ev["event"] == "progress" and batch_records(ev["progress"]):
                return float(ev["at"]) - float(self.result["run_started"])
        return None


@dataclass
class LaunchedJob:
    """A job child just started: the process, its tree's memory sampling, when it was launched
    (epoch s) and the result file it will write."""

    child: Child
    sampler: MemorySampler
    launched: float
    result_path: Path

    def abandon(self) -> None:
        """Stop the job and its sampling (interrupted by Ctrl-C or SIGTERM, or failed): never
        leave the job running against a stopped broker."""
        stop_job_child(self.child)
        self.sampler.__exit__()


def _child_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    return {**child_env(), **(extra or {})}


def start_job_child(
    env: BenchEnv,
    overrides: Sequence[str],
    result_path: Path,
    *,
    available_now: bool,
    spark_conf: dict[str, str] | None = None,
    timeout: float | None = None,
    extra_env: dict[str, str] | None = None,
) -> LaunchedJob:
    """Launch ipcount.bench.timed_job and sample its memory; its stdout/stderr go to a log file
    next to the result."""
    launched = time.time()
    cmd = [sys.executable, "-m", "ipcount.bench.timed_job", "--result", str(result_path)]
    cmd += env.cli(overrides)
    for key, value in (spark_conf or {}).items():
        cmd += ["--spark-conf", f"{key}={value}"]
    if available_now:
        # A benchmark's input is finished: every window is emitted and verified.
        cmd += ["--available-now", "--close-all-windows"]
    if timeout is not None:
        cmd += ["--timeout", str(timeout)]
    log = result_path.with_suffix(".log")
    # In the work directory: the job imports ipcount like any installed application would
    # (a variant's env.PYTHONPATH then wins over the checkout in the current directory).
    child = spawn(
        cmd,
        log=log,
        name="bench job",
        env=_child_env(extra_env),
        cwd=env.workdir,
        own_session=False,
        append=False,
    )
    sampler = MemorySampler(child.pid, broker_pid=env.broker_pid).__enter__()
    return LaunchedJob(child, sampler, launched, result_path)


def stop_job_child(child: Child, grace: float = 60.0) -> None:
    """SIGTERM (the job stops its queries cleanly), SIGKILL after `grace`."""
    child.stop(grace, kill_wait=None)


@contextlib.contextmanager
def sigterm_as_interrupt() -> Iterator[None]:
    """SIGTERM raises KeyboardInterrupt here, so a stopped benchmark still cleans up (job child,
    generators, broker, temp dir)."""

    def _raise(signum: int, frame: Any) -> None:
        raise KeyboardInterrupt

    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signal.SIGTERM, _raise)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def finish_job_child(job: LaunchedJob, timeout: float | None) -> JobRun:
    """Wait for the child, stop sampling, load its result.

    Raises:
        IpcountError: the child timed out, failed or wrote no result (with its log's tail).
    """
    result_path, sampler = job.result_path, job.sampler
    log = result_path.with_suffix(".log")
    try:
        status = job.child.wait(timeout)
    except BaseException:
        job.abandon()
        raise
    if status is None:
        job.abandon()
        raise IpcountError(f"the job did not finish within {timeout:g}s; log: {log}")
    exited = time.time()
    sampler.__exit__()
    if not result_path.is_file():
        raise IpcountError(f"the job exited with {status} and no result:\n{_tail(log)}")
    result = json.loads(result_path.read_text())
    if status != 0 or result.get("status") != 0:
        raise IpcountError(f"the job failed (exit {status}):\n{_tail(log)}")
    progress = [ev["progress"] for ev in result["events"] if ev["event"] == "progress"]
    return JobRun(status, job.launched, exited, result, sampler.peaks, log, progress)


def run_job_child(
    env: BenchEnv,
    overrides: Sequence[str],
    name: str,
    *,
    spark_conf: dict[str, str] | None = None,
    timeout: float = 3600.0,
    extra_env: dict[str, str] | None = None,
) -> JobRun:
    """Run the job with Trigger.AvailableNow in a child process until every window is committed."""
    result_path = env.workdir / f"job-{name}-{uuid.uuid4().hex[:6]}.json"
    job = start_job_child(
        env, overrides, result_path, available_now=True, spark_conf=spark_conf, extra_env=extra_env
    )
    return finish_job_child(job, timeout)


def _tail(log: Path, lines: int = 25) -> str:
    try:
        text = log.read_text(errors="replace").splitlines()
    except OSError:
        return f"(no log at {log})"
    keep = [line for line in text if "WARN" not in line or "ERROR" in line] or text
    return "\n".join(keep[-lines:])
