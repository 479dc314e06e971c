"""Shared machinery of the pipeline benchmarks (loadgen bench, --latency, --scaling), run in the
bench process: a broker and fresh topics per run, pre-loading with synth, the job in a child
process (loadgen.bench.job) with its process tree's memory sampled, and verification.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

from ipcount.config import Settings, load_settings
from ipcount.errors import IpcountError
from ipcount.kafka.topics import ensure_topics
from ipcount.local.broker import LocalBroker, free_port
from ipcount.local.kinds import configured_broker
from ipcount.verify.compare import VerifyReport, verify_sink
from ipcount.verify.ledger import Ledger
from loadgen.bench.memory import MemoryPeaks, MemorySampler
from loadgen.bench.report import Sustained, batch_records, sustained
from loadgen.generator import SynthSpec
from loadgen.synth import SynthResult, run_synth

__all__ = [
    "BenchEnv",
    "sigterm_as_interrupt",
    "stop_child",
    "JobRun",
    "MemoryPeaks",
    "MemorySampler",
    "bench_env",
    "preload",
    "run_job_child",
    "verify_run",
    "fmt_mb",
]

# Historical event time for pre-loaded records: fixed, so runs are comparable (2026-01-01 UTC).
DEFAULT_START_MS = 1_767_225_600_000


@dataclass
class BenchEnv:
    """Where a benchmark runs: a broker (own or given), a work directory, the base settings."""

    bootstrap: str
    workdir: Path
    config: str | None
    overrides: list[str]
    # PID of the benchmark's own broker (its CPU is reported: it shares the cores with the job);
    # None on a given --bootstrap cluster.
    broker_pid: int | None = None
    topics: list[str] = field(default_factory=list)

    @property
    def own_broker(self) -> bool:
        return self.broker_pid is not None

    def settings(self, tag: str, *extra: str) -> tuple[Settings, list[str]]:
        """Settings with fresh topics and checkpoint named after `tag`; also the override list
        that rebuilds them in a child process."""
        uid = _topic_safe(f"{tag}-{uuid.uuid4().hex[:6]}")
        overrides = [
            *self.overrides,
            f"kafka.bootstrap_servers={self.bootstrap}",
            f"topics.source=bench-src-{uid}",
            f"topics.sink=bench-sink-{uid}",
            f"topics.progress=bench-progress-{uid}",
            f"topics.late=bench-late-{uid}",
            f"topics.dead_letter=bench-dlq-{uid}",
            f"job.checkpoint_location={self.workdir / ('ckpt-' + uid)}",
            *extra,
        ]
        return self._load(overrides), overrides

    def _load(self, overrides: list[str]) -> Settings:
        settings = load_settings(self.config, overrides=overrides)
        t = settings.topics
        self.topics += [t.source, t.sink, t.progress, t.late, t.dead_letter]
        return settings

    def with_sink(self, overrides: Sequence[str], tag: str) -> tuple[Settings, list[str]]:
        """The same source topic, with fresh sink/progress topics and checkpoint (re-read the
        pre-loaded source in another configuration)."""
        uid = _topic_safe(f"{tag}-{uuid.uuid4().hex[:6]}")
        fresh = [
            *overrides,
            f"topics.sink=bench-sink-{uid}",
            f"topics.progress=bench-progress-{uid}",
            f"job.checkpoint_location={self.workdir / ('ckpt-' + uid)}",
        ]
        return self._load(fresh), fresh

    def delete_topics(self) -> None:
        """Delete the topics this benchmark named (on a given --bootstrap cluster)."""
        from confluent_kafka.admin import AdminClient

        from ipcount.kafka.client import with_client_logging

        base = load_settings(
            self.config, overrides=[*self.overrides, f"kafka.bootstrap_servers={self.bootstrap}"]
        )
        admin = AdminClient(with_client_logging(base.kafka.to_librdkafka("admin")))
        existing = set(admin.list_topics(timeout=10).topics)
        doomed = sorted(set(self.topics) & existing)
        for fut in admin.delete_topics(doomed).values() if doomed else ():
            with contextlib.suppress(Exception):
                fut.result(timeout=30)


def _topic_safe(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]", "-", text)


@contextlib.contextmanager
def bench_env(
    settings: Settings, bootstrap: str | None, overrides: Sequence[str], keep: bool = False
) -> Iterator[BenchEnv]:
    """A temp work dir and a broker: `bootstrap` if given, else the configured local broker kind
    ([broker] kind) on a free port,
    stopped by PID at the end."""
    config = (
        None if settings.source_path == "defaults" else str(Path(settings.source_path).resolve())
    )
    tmp = tempfile.mkdtemp(prefix="ipcount-bench-")
    broker: LocalBroker | None = None
    env: BenchEnv | None = None
    try:
        broker_pid = None
        if not bootstrap:
            broker = configured_broker(settings, Path(tmp) / "broker", free_port())
            broker_pid = broker.start(timeout=settings.broker.start_timeout_seconds)
            bootstrap = broker.bootstrap
        env = BenchEnv(bootstrap, Path(tmp), config, list(overrides), broker_pid)
        yield env
    finally:
        if broker is not None:
            broker.stop()
        elif env is not None and not keep:
            env.delete_topics()
        if not keep:
            import shutil

            shutil.rmtree(tmp, ignore_errors=True)


def preload(
    settings: Settings, count: int, spec: SynthSpec, start_ms: int, ledger_path: Path
) -> SynthResult:
    """Create the topics and load `count` records with loadgen synth's generator (as fast as
    possible, event time advancing spec.event_rate records per second from start_ms).

    Raises:
        IpcountError: a record was not delivered (the ledger would not match the topic).
    """
    ensure_topics(settings)
    result = run_synth(settings, spec, count=count, start_ms=start_ms, ledger_path=ledger_path)
    if result.errors or result.unreported or result.records != count:
        raise IpcountError(f"pre-load failed: {result.summary()}")
    return result


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
    def first_batch_s(self) -> float | None:
        """Query start until the first micro-batch with input finished."""
        for ev in self.result.get("events", []):
            if ev["event"] == "progress" and batch_records(ev["progress"]):
                return float(ev["at"]) - float(self.result["run_started"])
        return None


def _child_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    env = dict(os.environ)
    env.setdefault("PYSPARK_PYTHON", sys.executable)
    env.update(extra or {})
    return env


def start_job_child(
    env: BenchEnv,
    overrides: Sequence[str],
    result_path: Path,
    *,
    available_now: bool,
    spark_conf: dict[str, str] | None = None,
    timeout: float | None = None,
    extra_env: dict[str, str] | None = None,
) -> tuple[subprocess.Popen[bytes], Path]:
    """Launch loadgen.bench.job; its stdout/stderr go to a log file next to the result."""
    cmd = [sys.executable, "-m", "loadgen.bench.job", "--result", str(result_path)]
    if env.config:
        cmd += ["--config", env.config]
    for item in overrides:
        cmd += ["--set", item]
    for key, value in (spark_conf or {}).items():
        cmd += ["--spark-conf", f"{key}={value}"]
    if available_now:
        # A benchmark's input is finished: every window is emitted and verified.
        cmd += ["--available-now", "--close-all-windows"]
    if timeout is not None:
        cmd += ["--timeout", str(timeout)]
    log = result_path.with_suffix(".log")
    with open(log, "wb") as out:
        # In the work directory: the job imports ipcount like any installed application would
        # (a variant's env.PYTHONPATH then wins over the checkout in the current directory).
        proc = subprocess.Popen(
            cmd, stdout=out, stderr=subprocess.STDOUT, env=_child_env(extra_env), cwd=env.workdir
        )
    return proc, log


def stop_child(proc: subprocess.Popen[bytes], grace: float = 60.0) -> None:
    """SIGTERM (the job stops cleanly after its current micro-batch), SIGKILL after `grace`."""
    if proc.poll() is not None:
        return
    proc.terminate()
    try:
        proc.wait(grace)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


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


def finish_job_child(
    proc: subprocess.Popen[bytes],
    sampler: MemorySampler,
    launched: float,
    result_path: Path,
    log: Path,
    timeout: float | None,
) -> JobRun:
    """Wait for the child, stop sampling, load its result.

    Raises:
        IpcountError: the child timed out, failed or wrote no result (with its log's tail).
    """
    try:
        proc.wait(timeout)
    except subprocess.TimeoutExpired:
        stop_child(proc)
        sampler.__exit__()
        raise IpcountError(f"the job did not finish within {timeout:g}s; log: {log}") from None
    except BaseException:
        # Interrupted (Ctrl-C, SIGTERM): never leave the job running against a stopped broker.
        stop_child(proc)
        sampler.__exit__()
        raise
    exited = time.time()
    sampler.__exit__()
    if not result_path.is_file():
        raise IpcountError(f"the job exited with {proc.returncode} and no result:\n{_tail(log)}")
    result = json.loads(result_path.read_text())
    if proc.returncode != 0 or result.get("status") != 0:
        raise IpcountError(f"the job failed (exit {proc.returncode}):\n{_tail(log)}")
    progress = [ev["progress"] for ev in result["events"] if ev["event"] == "progress"]
    return JobRun(proc.returncode, launched, exited, result, sampler.peaks, log, progress)


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
    launched = time.time()
    proc, log = start_job_child(
        env, overrides, result_path, available_now=True, spark_conf=spark_conf, extra_env=extra_env
    )
    sampler = MemorySampler(proc.pid, broker_pid=env.broker_pid).__enter__()
    return finish_job_child(proc, sampler, launched, result_path, log, timeout)


def _tail(log: Path, lines: int = 25) -> str:
    try:
        text = log.read_text(errors="replace").splitlines()
    except OSError:
        return f"(no log at {log})"
    keep = [line for line in text if "WARN" not in line or "ERROR" in line] or text
    return "\n".join(keep[-lines:])


def verify_run(settings: Settings, ledger: Ledger) -> VerifyReport:
    """Read the sink with read_committed and compare it with the ledger."""
    return verify_sink(settings, ledger, "read_committed", deadline_seconds=300)


def fmt_mb(n: int) -> str:
    return f"{n / 2**20:.0f}"
