"""The state store's figures and the snapshot rule (issue #37), on listings and on a real dir."""

from __future__ import annotations

import os
from pathlib import Path

from ipcount.observe.state_store import (
    SnapshotRule,
    StateFile,
    StateStorePoller,
    figures_of,
    list_local_state,
    snapshot_problem,
)


def _store(partition: int, changelogs: range, snapshots: list[int], t0: float = 1000.0):  # type: ignore[no-untyped-def]
    files = [StateFile(f"0/{partition}/{v}.changelog", 100, t0 + v) for v in changelogs]
    files += [StateFile(f"0/{partition}/{v}.zip", 50, t0 + v) for v in snapshots]
    files.append(StateFile(f"0/{partition}/SSTs/{partition}-abc.sst", 1000, t0))
    return files


def test_figures_follow_the_partition_furthest_from_a_snapshot() -> None:
    files = _store(0, range(1, 101), [40, 80]) + _store(1, range(1, 101), [40])
    f = figures_of(files)
    assert (f.files, f.changelogs, f.snapshots, f.partitions) == (205, 200, 3, 2)
    assert f.bytes == 200 * 100 + 3 * 50 + 2 * 1000
    assert (f.latest_version, f.snapshot_version, f.lag_versions) == (100, 40, 60)
    assert f.worst_partition == "0/1"
    assert f.unsnapshotted_since == 1000.0 + 41


def test_a_store_that_never_snapshots_is_degraded_and_says_why() -> None:
    files = _store(0, range(1, 433), []) + _store(1, range(1, 433), [])
    f = figures_of(files)
    assert (f.snapshot_version, f.lag_versions) == (0, 432)
    why = snapshot_problem(f, SnapshotRule(30, 180.0), now=1000.0 + 432 + 60)
    assert why.startswith("state snapshots are not being written: store 0/")
    assert "432 versions" in why and "none yet" in why and "snapshot maintenance" in why


def test_snapshots_keeping_up_or_a_young_lag_are_healthy() -> None:
    rule = SnapshotRule(30, 180.0)
    ok = figures_of(_store(0, range(61, 101), [90]))
    assert snapshot_problem(ok, rule, now=5000.0) == ""
    # Many versions, but written in the last seconds (a backlog read fast): not yet a problem.
    young = figures_of(_store(0, range(1, 101), []))
    assert snapshot_problem(young, rule, now=1000.0 + 100 + 30) == ""
    assert snapshot_problem(figures_of([]), rule, now=0.0) == ""
    assert SnapshotRule.from_spark(10, 60.0) == SnapshotRule(30, 180.0)


def test_checkpoint_format_v2_names_count_too() -> None:
    f = figures_of([StateFile("0/0/7_1a2b.changelog", 1, 1.0), StateFile("0/0/5_9f.zip", 1, 1.0)])
    assert (f.changelogs, f.snapshots, f.snapshot_version, f.lag_versions) == (1, 1, 5, 2)


def test_a_local_checkpoint_is_listed_and_polled(tmp_path: Path) -> None:
    store = tmp_path / "state" / "0" / "1"
    store.mkdir(parents=True)
    for v in range(1, 41):
        (store / f"{v}.changelog").write_bytes(b"x" * 10)
        os.utime(store / f"{v}.changelog", (100.0, 100.0))
    (store / ".1.changelog.crc").write_bytes(b"c")
    listed = list_local_state(str(tmp_path))
    assert listed is not None and len(listed) == 40
    assert list_local_state("hdfs://nn/ckpt") is None
    seen = []
    poller = StateStorePoller(
        lambda: list_local_state(f"file://{tmp_path}"),
        SnapshotRule(30, 180.0),
        lambda figures, problem: seen.append((figures.changelogs, problem)),
        wall=lambda: 1000.0,
    )
    figures, problem = poller.poll_once() or (None, "")
    assert figures is not None and figures.bytes == 400
    assert seen[0][0] == 40 and "40 versions" in seen[0][1]
