"""The chaos runner's pure parts: the seeded fault plan, fault specs, log and checkpoint reading."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest

from ipcount.chaos.check import query_id
from ipcount.chaos.plan import (
    AFTER_COMMIT,
    BEFORE_COMMIT,
    BROKER_COMMIT,
    BROKER_HANG,
    BROKER_RESTART,
    EXECUTOR_KILL,
    INJECTED,
    KILL,
    ChaosEvent,
    ChaosOptions,
    ChaosReport,
    plan_events,
)
from ipcount.chaos.processes import (
    batch_ids,
    fault_spec,
    last_committed_batch,
    last_planned_batch,
)
from ipcount.errors import ConfigError
from ipcount.faults import parse_faults
from ipcount.local_pipeline.children import child_env, find_fault_line
from ipcount.verify.compare import VerifyReport


@pytest.mark.parametrize("seed", range(30))
def test_plan_has_each_kind_and_never_arms_a_fault_after_a_broker_restart(seed: int) -> None:
    plan = plan_events(5, 2, random.Random(seed))
    assert len(plan) == 7
    # Of two broker restarts, the second stops the broker while a commit is in flight.
    assert plan.count(BROKER_RESTART) == 1 and plan.count(BROKER_COMMIT) == 1
    for kind in (KILL, BEFORE_COMMIT, AFTER_COMMIT):
        assert kind in plan
    # A fault point is armed when the job starts: the job running after a broker restart (which
    # it may survive) was not started for it, so an injected fault never follows one.
    for here, after in zip(plan, plan[1:], strict=False):
        if here in (BROKER_RESTART, BROKER_COMMIT):
            assert after in (KILL, BROKER_RESTART, BROKER_COMMIT)


def test_broker_hangs_are_placed_like_restarts() -> None:
    plan = plan_events(3, 1, random.Random(5), broker_hangs=2)
    assert plan.count(BROKER_HANG) == 2 and plan.count(BROKER_RESTART) == 1
    for here, after in zip(plan, plan[1:], strict=False):
        if here in (BROKER_RESTART, BROKER_HANG):
            assert after in (KILL, BROKER_RESTART, BROKER_HANG)


def test_plan_is_reproducible_and_small_plans_prefer_injected_faults() -> None:
    assert plan_events(4, 1, random.Random(7)) == plan_events(4, 1, random.Random(7))
    assert plan_events(1, 0, random.Random(1)) == [BEFORE_COMMIT]
    assert sorted(plan_events(2, 0, random.Random(1))) == sorted([BEFORE_COMMIT, AFTER_COMMIT])
    assert plan_events(0, 1, random.Random(1)) == [BROKER_RESTART]


def test_fault_spec_covers_a_range_and_parses() -> None:
    spec = fault_spec(BEFORE_COMMIT, 7, 3)
    assert parse_faults(spec) == {(BEFORE_COMMIT, 7), (BEFORE_COMMIT, 8), (BEFORE_COMMIT, 9)}


def test_fault_line_is_found_in_a_log() -> None:
    log = "x\n11:00:01 ERROR ipcount.faults: fault injection: sink.after_commit@12: SIGKILL to process group 4242\n"
    line = find_fault_line(log)
    assert line is not None and (line.point, line.batch) == (AFTER_COMMIT, 12)
    assert find_fault_line("no fault here") is None


def test_checkpoint_logs_and_query_id(tmp_path: Path) -> None:
    assert last_committed_batch(tmp_path) is None
    for name in ("0", "1", "2", ".2.crc", "tmp"):
        (tmp_path / "offsets").mkdir(exist_ok=True)
        (tmp_path / "offsets" / name).write_text("v1")
    (tmp_path / "commits").mkdir()
    (tmp_path / "commits" / "0").write_text("v1")
    (tmp_path / "commits" / "1").write_text("v1")
    assert batch_ids(tmp_path / "offsets") == [0, 1, 2]
    assert (last_planned_batch(tmp_path), last_committed_batch(tmp_path)) == (2, 1)
    assert query_id(tmp_path) is None
    (tmp_path / "metadata").write_text(json.dumps({"id": "abc"}))
    assert query_id(tmp_path) == "abc"


def test_child_env_never_inherits_a_pinned_group_or_faults() -> None:
    base = {"IPCOUNT_FAULTS": "sink.before_commit@1", "IPCOUNT_FAULTS_PGID": "1", "PATH": "/bin"}
    env = child_env(base)
    assert "IPCOUNT_FAULTS" not in env and "IPCOUNT_FAULTS_PGID" not in env
    env = child_env(base, faults="sink.after_commit@3", faults_log="/tmp/x.log")
    assert env["IPCOUNT_FAULTS"] == "sink.after_commit@3"
    assert env["IPCOUNT_FAULTS_LOG"] == "/tmp/x.log"
    assert "IPCOUNT_FAULTS_PGID" not in env


def test_options_validate_and_default_rate(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="--records"):
        ChaosOptions(tmp_path, records=10).validate()
    with pytest.raises(ConfigError, match="--rate"):
        ChaosOptions(tmp_path, rate=0).validate()
    opts = ChaosOptions(tmp_path, records=8000, seconds_per_fault=40)
    assert opts.effective_rate(4) == 8000 / 200
    assert ChaosOptions(tmp_path, rate=123).effective_rate(4) == 123


def test_report_counts_and_contrast(tmp_path: Path) -> None:
    report = ChaosReport(seed=1, run_dir=tmp_path)
    report.events = [
        ChaosEvent(1.0, KILL, 3, "SIGKILL"),
        ChaosEvent(2.0, BEFORE_COMMIT, 5, "fired"),
        ChaosEvent(3.0, AFTER_COMMIT, None, "did not fire", injected=False),
    ]
    report.committed = VerifyReport(results=10)
    report.uncommitted = VerifyReport(results=10, duplicates=4, isolation="read_uncommitted")
    assert (report.kills, report.missed, report.duplicates_prevented) == (2, 1, 4)
    assert report.exact and not report.ok
    assert "kills_survived=2" in report.summary() and "duplicates_prevented=4" in report.summary()
    assert report.events[0].line().split()[1:3] == [KILL, "batch=3"]


def test_fault_env_vars_are_not_settings() -> None:
    # `ipcount run` under the chaos runner gets these; they must not be read as settings.
    from ipcount.config import load_settings

    env = {
        "IPCOUNT_FAULTS": "sink.before_commit@3",
        "IPCOUNT_FAULTS_PGID": "123",
        "IPCOUNT_FAULTS_LOG": "/tmp/job.log",
        "IPCOUNT_SPARK_LOG_LEVEL": "INFO",
        "IPCOUNT_JOB_WINDOW_SECONDS": "10",
    }
    assert load_settings(None, env=env, use_default_path=False).job.window_seconds == 10


def test_recovery_figures_are_median_and_maximum(tmp_path: Path) -> None:
    from ipcount.chaos.plan import ChaosEvent, ChaosReport

    report = ChaosReport(1, tmp_path)
    assert report.recovery_figures() == "recovery_s_p50=- recovery_s_max=-"
    for i, seconds in enumerate([4.0, 1.0, None, 9.5, 2.0]):
        report.events.append(ChaosEvent(float(i), "kill", i, "x", recovery_s=seconds))
    assert report.recovery_figures() == "recovery_s_p50=3.0 recovery_s_max=9.5"
    assert report.summary().endswith("recovery_s_p50=3.0 recovery_s_max=9.5")


def test_a_detected_broker_loss_ends_with_its_figures_and_never_as_exact(tmp_path: Path) -> None:
    from ipcount.chaos.plan import ChaosEvent, ChaosReport

    report = ChaosReport(1, tmp_path)
    report.events.append(ChaosEvent(1.0, "kill", 3, "x", recovery_s=12.0))
    report.broker_loss = "detected broker loss: ... batch 26 ..."
    assert (
        report.final_line()
        == "recovery_s_p50=12.0 recovery_s_max=12.0 broker_loss=detected exact=false"
    )
    assert not report.ok


def test_cluster_faults_hold_each_kind_and_each_moment() -> None:
    from ipcount.chaos.plan import CLUSTER_KINDS, CLUSTER_MOMENTS, split_cluster_event

    plan = plan_events(10, 0, random.Random(7), cluster_faults=6)
    cluster = [split_cluster_event(e) for e in plan if split_cluster_event(e)]
    assert sorted(k for k, _ in cluster) == sorted(CLUSTER_KINDS)
    assert sorted(m for _, m in cluster) == sorted(CLUSTER_MOMENTS * 2)
    # Placed like broker restarts, only before a random kill or at the end: the job that rides
    # through a cluster fault never has to carry a kill it was not armed for.
    for event, after in zip(plan, [*plan[1:], None], strict=True):
        if split_cluster_event(event):
            assert after in (KILL, None) or split_cluster_event(after or ""), plan
    # Runs without a cluster keep the plan their seed always gave.
    assert plan_events(5, 2, random.Random(3)) == plan_events(
        5, 2, random.Random(3), cluster_faults=0
    )


def test_a_frozen_writer_waits_where_the_moment_says() -> None:
    from ipcount.chaos.plan import freeze_point

    assert freeze_point("coordinator-kill@in-commit") == BEFORE_COMMIT
    assert freeze_point("two-down@after-commit") == AFTER_COMMIT
    assert freeze_point("leader-kill@random") is None
    assert freeze_point(BROKER_COMMIT) == BEFORE_COMMIT
    assert freeze_point(KILL) is None and freeze_point(None) is None


def test_cluster_options_are_checked(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="--broker-nodes"):
        ChaosOptions(tmp_path, broker_nodes=2).validate()
    with pytest.raises(ConfigError, match="--use-configured-broker"):
        ChaosOptions(tmp_path, broker_nodes=3, use_configured_broker=True).validate()
    ChaosOptions(tmp_path, broker_nodes=3).validate()


def test_cluster_lines_say_per_kind_what_the_job_did(tmp_path: Path) -> None:
    report = ChaosReport(1, tmp_path)
    for restarts, died, rec in ((0, False, 2.0), (1, False, 14.0), (0, True, 40.0)):
        ev = ChaosEvent(1.0, "leader-kill@random", 3, "x", recovery_s=rec)
        ev.query_restarts, ev.job_died = restarts, died
        report.events.append(ev)
    (line,) = report.cluster_lines()
    assert line.split() == [
        "leader-kill",
        "n=3",
        "rode_through=1",
        "query_restarted=1",
        "job_restarted=1",
        "recovery_s_p50=14.0",
        "recovery_s_max=40.0",
    ]
    assert report.cluster_faults == 3 and "cluster_faults=3" in report.summary()


@pytest.mark.parametrize("seed", range(10))
def test_a_standalone_plan_kills_executors_too(seed: int) -> None:
    # Four kills on a standalone cluster: the driver, an executor and the two fault points.
    assert sorted(plan_events(4, 0, random.Random(seed), executors=True)) == sorted(
        [KILL, EXECUTOR_KILL, BEFORE_COMMIT, AFTER_COMMIT]
    )
    twenty = plan_events(20, 1, random.Random(seed), executors=True)
    assert len(twenty) == 21 and {KILL, EXECUTOR_KILL, *INJECTED, BROKER_RESTART} == set(twenty)
    # Local mode plans no executor kills, and its plans stay what they were.
    assert EXECUTOR_KILL not in plan_events(20, 1, random.Random(seed))
    assert plan_events(5, 2, random.Random(seed)) == plan_events(
        5, 2, random.Random(seed), executors=False
    )


def test_standalone_options_are_checked(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="--standalone-workers must be"):
        ChaosOptions(tmp_path, standalone_workers=-1).validate()
    with pytest.raises(ConfigError, match="--standalone-workers takes --broker-restarts 0 or 1"):
        ChaosOptions(tmp_path, standalone_workers=2, broker_restarts=2).validate()
    with pytest.raises(ConfigError, match="one broker node"):
        ChaosOptions(tmp_path, standalone_workers=2, broker_nodes=3).validate()
    ChaosOptions(tmp_path, standalone_workers=2, broker_restarts=1, broker_hangs=1).validate()


def test_report_counts_executor_kills_as_kills(tmp_path: Path) -> None:
    report = ChaosReport(seed=1, run_dir=tmp_path)
    report.events = [
        ChaosEvent(1.0, EXECUTOR_KILL, 3, "x"),
        ChaosEvent(2.0, KILL, 4, "y"),
        ChaosEvent(3.0, BEFORE_COMMIT, 5, "z"),
    ]
    assert report.kills == 3
    assert "kills_survived=3 (random=1 before_commit=1 after_commit=0 executor=1)" in (
        report.summary()
    )
