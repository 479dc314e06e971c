"""The in-commit broker restart resumes a writer only once it has really stopped itself."""

from __future__ import annotations

import signal
import subprocess

from ipcount.chaos.broker_faults import _wait_stopped


def test_wait_stopped_sees_a_stopped_process_and_not_a_running_or_gone_one() -> None:
    proc = subprocess.Popen(["sleep", "30"])
    try:
        assert not _wait_stopped(proc.pid, 0.3)  # running: the fault line came first
        proc.send_signal(signal.SIGSTOP)
        assert _wait_stopped(proc.pid, 5.0)
        proc.send_signal(signal.SIGCONT)
    finally:
        proc.kill()
        proc.wait()
    assert not _wait_stopped(proc.pid, 0.3)  # gone
