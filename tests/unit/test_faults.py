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
