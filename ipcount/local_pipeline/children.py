"""The child processes of a local pipeline run (driver side): the Spark job as a separate
process group that can be SIGKILLed whole, `loadgen synth` runs, and the environment both get."""

from __future__ import annotations

import contextlib
import logging
import os
import re
import signal
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from ipcount.childproc import KILL_EXIT_CODES, Child, session_processes, spawn
from ipcount.faults import ENV_VAR as FAULTS_ENV_VAR
from ipcount.faults import LOG_ENV_VAR, PGID_ENV_VAR
from ipcount.verify.ledger import Ledger

__all__ = ["FaultLine", "JobProcess", "SynthProcess", "child_env", "find_fault_line"]

logger = logging.getLogger(__name__)

# What ipcount.faults logs just before the SIGKILL: "fault injection: sink.before_commit@7: ...".
_FAULT_LINE = re.compile(r"fault injection: (?P<point>[a-z_.]+)@(?P<batch>-?\d+): SIGKILL")
_STOP_LINE = re.compile(
    r"fault injection: (?P<point>[a-z_.]+)@(?P<batch>-?\d+): SIGSTOP to pid (?P<pid>\d+)"
)
# Both of ipcount.sink.transaction's messages for a writer that a newer job fenced say this.
_FENCED = "two jobs are using the same checkpoint"


@dataclass(frozen=True)
class FaultLine:
    """A fault point that fired, from the job's log."""

    point: str
    batch: int


def find_fault_line(text: str) -> FaultLine | None:
    """The fault-injection line in a job log, if a fault point fired."""
    m = _FAULT_LINE.search(text)
    return FaultLine(m.group("point"), int(m.group("batch"))) if m else None


def child_env(
    base: Mapping[str, str] | None = None, faults: str = "", faults_log: str | Path = ""
) -> dict[str, str]:
    """The environment for a job/loadgen child: this interpreter for Spark's Python workers,
    IPCOUNT_FAULTS (and the file fault points write their line to) only when given, and never an
    inherited pinned process group (the child would kill whoever pinned it, e.g. the test runner).
    """
    env = dict(os.environ if base is None else base)
    for name in (PGID_ENV_VAR, FAULTS_ENV_VAR, LOG_ENV_VAR):
        env.pop(name, None)
    env.setdefault("PYSPARK_PYTHON", sys.executable)
    env.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    env.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    if faults:
        env[FAULTS_ENV_VAR] = faults
        if faults_log:
            env[LOG_ENV_VAR] = str(faults_log)
    return env


class _ChildRun:
    """What a job run and a synth run share: the child process, its status and its log."""

    child: Child

    @property
    def alive(self) -> bool:
        return self.child.alive

    @property
    def returncode(self) -> int | None:
        return self.child.returncode

    def log_text(self) -> str:
        return self.child.log_text()


class JobProcess(_ChildRun):
    """One run of `python -m ipcount ... run` in its own session, logging to its own file.

    Its own session (start_new_session) makes the Python driver the leader of a process group
    holding the driver JVM too, so `kill()` (os.killpg with SIGKILL) is a real crash of the whole
    job, like ipcount.faults' points. The pyspark daemon moves itself and its Python workers to
    another group of the same session: they die with the JVM, and `reap()` makes sure of it.
    """

    def __init__(
        self,
        argv: Sequence[str],
        log_path: Path,
        *,
        env: Mapping[str, str],
        cwd: str | Path | None = None,
        name: str = "job",
    ) -> None:
        self.argv = list(argv)
        self.log_path = log_path
        self.name = name
        self.faults = env.get(FAULTS_ENV_VAR, "")
        self.child = spawn(self.argv, log=log_path, name=name, env=env, cwd=cwd)
        self.pid = self.child.pid
        self.started = time.monotonic()
        # The last committed batch when it started (set by the caller): progress counts from it.
        self.committed_at_start: int | None = None
        # The chaos event its faults were armed for (set by the caller).
        self.armed: str | None = None
        logger.info("%s started: pid %d, log %s", name, self.pid, log_path)

    @property
    def killed(self) -> bool:
        """Whether it ended by SIGKILL (-9 from Popen, or 137 through a shell)."""
        return self.returncode in KILL_EXIT_CODES

    def log_tail(self, lines: int = 30) -> str:
        keep = [ln for ln in self.log_text().splitlines() if "GLIBC_2.39" not in ln]
        return "\n".join(keep[-lines:])

    def stopped_writer(self) -> tuple[int, int] | None:
        """(batch, pid) of the Python worker a "/stop" fault froze, if its log says one did."""
        m = _STOP_LINE.search(self.log_text())
        return (int(m.group("batch")), int(m.group("pid"))) if m else None

    def fault_fired(self) -> FaultLine | None:
        """The fault point that killed it, if its log says one fired."""
        return find_fault_line(self.log_text())

    def fenced(self) -> bool:
        """Whether its log says the sink was fenced by a newer producer (FatalKafkaError)."""
        # Both messages say it, one at a sentence's start ("Two jobs ..."): ignore case.
        return _FENCED in self.log_text().lower()

    def kill(self) -> None:
        """SIGKILL the whole process group (driver and JVM), then reap what is left."""
        self.child.kill(30)
        self.child.reap()

    def terminate(self, timeout: float = 90.0) -> int | None:
        """SIGTERM the driver (a clean stop: a micro-batch in flight is cancelled and replayed at
        the next start); SIGKILL after timeout."""
        self.child.stop(timeout)
        self.child.reap()
        return self.returncode

    def freeze(self) -> None:
        """SIGSTOP every process of the job (driver, JVM, Python workers): a zombie-to-be, like
        a job behind a long GC pause, a frozen VM or a network partition."""
        self._signal_session(signal.SIGSTOP)

    def thaw(self) -> None:
        """SIGCONT every process of the job: it carries on where it was frozen."""
        self._signal_session(signal.SIGCONT)

    def _signal_session(self, sig: int) -> None:
        for pid in session_processes(self.pid):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, sig)

    def wait(self, timeout: float) -> int | None:
        """Wait up to `timeout` seconds for the driver to exit; its exit status or None."""
        return self.child.wait(timeout)

    def reap(self, timeout: float = 15.0) -> None:
        """Wait for the rest of the session (pyspark daemon, Python workers) to go, SIGKILLing
        stragglers after `timeout`: the processes of a dead job must not outlive it."""
        self.child.reap(timeout)


class SynthProcess(_ChildRun):
    """One `loadgen synth` run: paced records into the source topic and a ledger of them."""

    def __init__(
        self,
        cli: Sequence[str],
        *,
        rate: float,
        ledger: Path,
        log_path: Path,
        env: Mapping[str, str],
        count: int | None = None,
        duration: float | None = None,
        seed: int | None = None,
        ips: int | None = None,
        late_fraction: float | None = None,
        late_behind_seconds: float | None = None,
        malformed_fraction: float | None = None,
        name: str = "synth",
    ) -> None:
        """Start `loadgen CLI synth` for `count` records or `duration` seconds; the options
        left None are loadgen's defaults."""
        self.count, self.ledger, self.log_path = count, ledger, log_path
        self.stopped = False
        options = {
            "--count": count,
            "--duration": duration,
            "--ips": ips,
            "--late-fraction": late_fraction,
            "--late-behind-seconds": late_behind_seconds,
            "--malformed-fraction": malformed_fraction,
            "--seed": seed,
        }
        argv = [sys.executable, "-m", "loadgen", *cli, "synth", "--rate", f"{rate:g}"]
        for flag, value in options.items():
            if value is not None:
                argv += [flag, f"{value:g}" if isinstance(value, float) else str(value)]
        argv += ["--ledger", str(ledger)]
        self.child = spawn(argv, log=log_path, name=name, env=env, own_session=False)

    def summary(self) -> str:
        """Its `synth: records=...` line (empty until it has finished)."""
        lines = self.log_text().splitlines()
        return next((ln for ln in reversed(lines) if ln.startswith("synth:")), "")

    @property
    def ok(self) -> bool:
        """Ended well: all its records delivered (0), or stopped by `stop()`: after delivering
        and recording what it had sent (130), or before it started producing (SIGTERM before
        its handler was installed: nothing sent, no ledger)."""
        code = self.returncode
        return code == 0 or (self.stopped and code in (130, -signal.SIGTERM))

    def delivered(self) -> int:
        """Records in its ledger (0 until it has ended and written it)."""
        if self.alive or not self.ledger.is_file():
            return 0
        return Ledger.load(self.ledger).records

    def stop(self, timeout: float = 30.0) -> None:
        """SIGTERM: it stops generating, flushes, writes its ledger (SIGKILL after `timeout`)."""
        if self.alive:
            self.stopped = True
            self.child.stop(timeout, kill_wait=5)
