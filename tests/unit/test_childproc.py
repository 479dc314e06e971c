"""A child started by ipcount.childproc writes to its log, and stopping it leaves nothing behind:
a child that ignores SIGTERM is killed with everything it started."""

from __future__ import annotations

import signal
import sys
import time
from pathlib import Path

from ipcount.childproc import (
    KILL_EXIT_CODES,
    pid_alive,
    session_processes,
    spawn,
    stop_pid,
)

# Starts a grandchild (a sleep), says so, then ignores SIGTERM: only a SIGKILL to the group ends
# both.
_STUBBORN = """
import signal, subprocess, sys, time
signal.signal(signal.SIGTERM, signal.SIG_IGN)
grandchild = subprocess.Popen(["sleep", "120"])
print("grandchild", grandchild.pid, flush=True)
time.sleep(120)
"""


def _grandchild(log: Path, timeout: float = 10.0) -> int:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for line in log.read_text(encoding="utf-8").splitlines():
            if line.startswith("grandchild "):
                return int(line.split()[1])
        time.sleep(0.05)
    raise AssertionError(f"no grandchild line in {log}: {log.read_text(encoding='utf-8')!r}")


def test_stop_kills_a_child_that_ignores_sigterm_with_what_it_started(tmp_path: Path) -> None:
    log = tmp_path / "child.log"
    child = spawn([sys.executable, "-c", _STUBBORN], log=log, name="stubborn")
    grandchild = _grandchild(log)
    assert child.alive and pid_alive(grandchild)

    status = child.stop(0.5)

    assert status in KILL_EXIT_CODES
    child.reap(5.0)
    assert not pid_alive(grandchild)
    assert session_processes(child.pid) == []


def test_a_clean_child_stops_on_sigterm_and_its_output_is_in_the_log(tmp_path: Path) -> None:
    log = tmp_path / "child.log"
    log.write_text("earlier run\n", encoding="utf-8")
    child = spawn(
        [sys.executable, "-c", "import time; print('ready', flush=True); time.sleep(120)"],
        log=log,
    )
    deadline = time.monotonic() + 10
    while "ready" not in child.log_text() and time.monotonic() < deadline:
        time.sleep(0.05)

    assert child.stop(10.0) == -signal.SIGTERM
    assert child.log_text().splitlines() == ["earlier run", "ready"]  # appended, not truncated


def test_stop_pid_stops_a_process_that_is_not_our_child(tmp_path: Path) -> None:
    # A process another `ipcount` invocation started, known only by the PID it recorded.
    log = tmp_path / "outer.log"
    outer = spawn([sys.executable, "-c", _STUBBORN], log=log, own_session=False)
    grandchild = _grandchild(log)

    stop_pid(grandchild, 5.0)

    assert not pid_alive(grandchild)
    outer.kill()
