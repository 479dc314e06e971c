"""`ipcount broker stop` signals only the broker it started: a state file whose PID now names
another process (the broker died and the PID was reused) is removed, and nothing is signalled."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from ipcount.childproc import pid_alive, process_identity
from ipcount.local.noida import NoidaBroker

ROOT = Path(__file__).resolve().parents[3]


@pytest.fixture
def stranger() -> Iterator[subprocess.Popen[bytes]]:
    """A process that is not the broker (someone else's, here a sleep)."""
    proc = subprocess.Popen(["sleep", "120"])  # noqa: S607 - coreutils
    yield proc
    proc.kill()
    proc.wait()


def _gone_broker_identity() -> dict[str, str]:
    """The identity a broker had: a process that started, was recorded, and died (a few clock
    ticks apart from the stranger: start times count in 1/100 s)."""
    time.sleep(0.05)
    proc = subprocess.Popen(["sleep", "120"])  # noqa: S607 - coreutils
    identity = process_identity(proc.pid)
    proc.kill()
    proc.wait()
    assert identity is not None
    return identity


def _record(data_dir: Path, pid: int, identity: dict[str, str]) -> Path:
    data_dir.mkdir(parents=True, exist_ok=True)
    state = data_dir / "ipcount-broker.json"
    state.write_text(
        json.dumps({"pid": pid, "host": "127.0.0.1", "port": 9092, "kind": "noida-db", **identity}),
        encoding="utf-8",
    )
    return state


def test_broker_stop_does_not_signal_a_process_that_reused_the_pid(
    tmp_path: Path, stranger: subprocess.Popen[bytes]
) -> None:
    data_dir = tmp_path / "broker"
    state = _record(data_dir, stranger.pid, _gone_broker_identity())
    done = subprocess.run(  # noqa: S603 - this interpreter
        [sys.executable, "-m", "ipcount", "broker", "stop"],
        env={**os.environ, "IPCOUNT_BROKER_DATA_DIR": str(data_dir)},
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    assert f"nothing stopped: {state} names pid {stranger.pid}" in done.stdout, done.stdout
    assert "another process now" in done.stdout and "removed the stale state file" in done.stdout
    assert stranger.poll() is None and pid_alive(stranger.pid)  # not signalled
    assert not state.exists()


def test_a_rebooted_machine_makes_the_state_stale(
    tmp_path: Path, stranger: subprocess.Popen[bytes]
) -> None:
    identity = process_identity(stranger.pid)
    assert identity is not None
    broker = NoidaBroker(tmp_path)
    _record(tmp_path, stranger.pid, {**identity, "boot_id": "0" * 32})
    assert broker.pid is None and not broker.status().running
    reason = broker.stale_reason()
    assert reason is not None and "rebooted" in reason
    broker.kill()  # the crash tests' SIGKILL: no stranger killed either
    assert stranger.poll() is None
    assert not broker.state_file.exists()


def test_broker_stop_still_stops_the_process_it_recorded(
    tmp_path: Path, stranger: subprocess.Popen[bytes]
) -> None:
    identity = process_identity(stranger.pid)
    assert identity is not None
    broker = NoidaBroker(tmp_path)
    _record(tmp_path, stranger.pid, identity)
    assert broker.stale_reason() is None and broker.pid == stranger.pid
    assert broker.stop(timeout=5)
    assert stranger.wait(5) is not None
    assert not broker.state_file.exists()
