"""IPCOUNT_FAULTS parsing and the no-op path of fault points (the kill itself is an integration test)."""

from __future__ import annotations

import pytest

from ipcount.errors import ConfigError
from ipcount.faults import fault_point, parse_faults, pin_process_group


def test_parse_lists_points_and_batches() -> None:
    assert parse_faults(" sink.before_commit@3, sink.after_commit@5 ,") == {
        ("sink.before_commit", 3),
        ("sink.after_commit", 5),
    }
    assert parse_faults("") == frozenset()


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("sink.before_commit", "must look like point@batchId"),
        ("sink.before_commit@x", "must look like point@batchId"),
        ("sink.befor_commit@1", "unknown fault point 'sink.befor_commit'"),
    ],
)
def test_bad_specs_name_the_env_var(spec: str, message: str) -> None:
    with pytest.raises(ConfigError, match=f"IPCOUNT_FAULTS: .*{message}"):
        parse_faults(spec)


def test_fault_point_does_nothing_when_not_selected(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("IPCOUNT_FAULTS", raising=False)
    fault_point("sink.before_commit", 1)
    monkeypatch.setenv("IPCOUNT_FAULTS", "sink.before_commit@2,sink.after_commit@1")
    fault_point("sink.before_commit", 1)  # other batch
    fault_point("sink.after_commit", 2)  # other point


def test_pin_process_group_only_with_faults(monkeypatch: pytest.MonkeyPatch) -> None:
    import os

    # setenv first, so monkeypatch restores "unset" afterwards: a pin leaking into later tests
    # would make their fault-injected child processes kill pytest's own process group.
    for name in ("IPCOUNT_FAULTS_PGID", "IPCOUNT_FAULTS"):
        monkeypatch.setenv(name, "")
        monkeypatch.delenv(name)
    pin_process_group()
    assert "IPCOUNT_FAULTS_PGID" not in os.environ
    monkeypatch.setenv("IPCOUNT_FAULTS", "sink.after_commit@4")
    pin_process_group()
    assert os.environ["IPCOUNT_FAULTS_PGID"] == str(os.getpgid(0))
    monkeypatch.setenv("IPCOUNT_FAULTS_PGID", "12345")
    pin_process_group()  # an outer launcher's pin wins
    assert os.environ["IPCOUNT_FAULTS_PGID"] == "12345"


def test_stop_entries_parse_like_kill_entries() -> None:
    assert parse_faults("sink.before_commit@3/stop") == {("sink.before_commit", 3)}


def test_a_stop_over_a_range_of_batches_fires_once_per_job(tmp_path) -> None:  # type: ignore[no-untyped-def]
    import os
    import signal
    import subprocess
    import sys

    # A worker process that passes the fault point for batches 3, 4 and 5, as Spark's commits do.
    child = (
        "from ipcount.faults import fault_point\n"
        "for b in (3, 4, 5):\n"
        "    fault_point('sink.before_commit', b)\n"
        "print('done')\n"
    )
    env = {
        **os.environ,
        "IPCOUNT_FAULTS": ",".join(f"sink.before_commit@{b}/stop" for b in (3, 4, 5)),
        "IPCOUNT_FAULTS_STATE": str(tmp_path),
    }
    for name in ("IPCOUNT_FAULTS_PGID", "IPCOUNT_FAULTS_LOG"):
        env.pop(name, None)

    def run() -> tuple[int, str]:
        proc = subprocess.Popen(
            [sys.executable, "-c", child], env=env, stdout=subprocess.PIPE, text=True
        )
        stops = 0
        while True:
            _, status = os.waitpid(proc.pid, os.WUNTRACED)
            if os.WIFSTOPPED(status):
                stops += 1
                os.kill(proc.pid, signal.SIGCONT)
                continue
            assert os.WEXITSTATUS(status) == 0
            return stops, proc.stdout.read() if proc.stdout else ""

    assert run() == (1, "done\n")  # froze at batch 3 only
    assert run() == (0, "done\n")  # a later process of the same job: already fired
