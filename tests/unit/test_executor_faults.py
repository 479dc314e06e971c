"""Fault points inside an executor (IPCOUNT_FAULTS_TARGET=executor): a real process tree shaped
like a Spark executor's (a process named like the executor JVM, a pyspark-daemon-like child in
its own process group running the sink task) takes the kill, once per arming."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

from ipcount.chaos.executor_faults import arm, executor_fault_lines
from ipcount.faults import EXECUTOR_CLASS

# The "executor": its command line names the executor's main class; it starts the "daemon" (own
# process group, as pyspark's daemon makes), which passes the fault point for batches 3 and 4,
# as two batches' sink tasks would, then prints and sleeps.
_TASK = (
    "import os, sys, time\n"
    "os.setpgid(0, 0)\n"
    "from ipcount.faults import fault_point\n"
    "for b in (3, 4):\n"
    "    fault_point('sink.before_commit', b)\n"
    "print('passed', flush=True)\n"
)
_EXECUTOR = (
    "import subprocess, sys, time\n"
    "task = subprocess.Popen([sys.executable, '-c', sys.argv[1]])\n"
    "print('task', task.wait(), flush=True)\n"
    "time.sleep(60)\n"
)


def _executor(env: dict[str, str]) -> subprocess.Popen[str]:
    # argv[2] carries the class name, so /proc/PID/cmdline holds it as a JVM's would.
    return subprocess.Popen(
        [sys.executable, "-c", _EXECUTOR, _TASK, EXECUTOR_CLASS],
        env=env,
        stdout=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )


def test_an_armed_point_kills_its_executor_once_per_arming(tmp_path: Path) -> None:
    armed, state, log = tmp_path / "armed", tmp_path / "state", tmp_path / "faults.log"
    state.mkdir()
    env = {
        **os.environ,
        "IPCOUNT_FAULTS_TARGET": "executor",
        "IPCOUNT_FAULTS_FILE": str(armed),
        "IPCOUNT_FAULTS_STATE": str(state),
        "IPCOUNT_FAULTS_LOG": str(log),
    }
    for name in ("IPCOUNT_FAULTS", "IPCOUNT_FAULTS_PGID"):
        env.pop(name, None)

    def run() -> tuple[int | None, str]:
        proc = _executor(env)
        try:
            out = ""
            deadline = time.monotonic() + 30
            while proc.poll() is None and "task" not in out and time.monotonic() < deadline:
                line = proc.stdout.readline() if proc.stdout else ""
                out += line
            return proc.poll(), out
        finally:
            if proc.poll() is None:
                proc.kill()
            proc.wait()

    # Not armed (no file): the task passes, the executor lives on.
    assert run() == (None, "passed\ntask 0\n")
    # Armed for batches 3 and 4: the first task to reach the point kills the executor and itself.
    arm(armed, "sink.before_commit@3,sink.before_commit@4")
    code, out = run()
    assert code == -9 and "passed" not in out, out
    (fired,) = executor_fault_lines(log)
    assert (fired.point, fired.batch, fired.partition) == ("sink.before_commit", 3, None)
    # The retried task (a new executor, same arming) goes through: once per arming.
    assert run() == (None, "passed\ntask 0\n")
    # A new arming fires again; disarmed, nothing fires.
    arm(armed, "sink.before_commit@4")
    assert run()[0] == -9
    assert [f.batch for f in executor_fault_lines(log)] == [3, 4]
    arm(armed, "")
    assert run() == (None, "passed\ntask 0\n")


def test_outside_an_executor_the_point_kills_nothing(tmp_path: Path) -> None:
    armed, state = tmp_path / "armed", tmp_path / "state"
    state.mkdir()
    arm(armed, "sink.after_commit@1")
    env = {
        **os.environ,
        "IPCOUNT_FAULTS_TARGET": "executor",
        "IPCOUNT_FAULTS_FILE": str(armed),
        "IPCOUNT_FAULTS_STATE": str(state),
    }
    done = subprocess.run(
        [sys.executable, "-c", "from ipcount.faults import fault_point\n"
         "fault_point('sink.after_commit', 1)\nprint('alive')"],
        env=env, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert done.stdout == "alive\n"
    assert "no Spark executor JVM" in done.stderr
