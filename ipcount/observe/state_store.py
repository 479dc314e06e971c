"""The counting query's state store on disk (driver): its size, its snapshots, and whether Spark
still writes them.

Spark's RocksDB store writes one changelog per micro-batch and every few versions uploads a
snapshot (`<version>.zip` and SST files); once a snapshot exists, older versions beyond those
Spark retains are purged. When a snapshot upload fails, Spark only logs "Ignoring error while
performing snapshot maintenance": the changelog then grows without bound and every restart replays
it all. This module reads the checkpoint's `state/` directory, so the job can export what it holds
and say on /healthz when snapshots have stopped. Pure functions plus one polling thread, set up
from Spark's snapshot settings by state_store_poller.
"""

from __future__ import annotations

import logging
import os
import re
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from ipcount.checkpoint.offset_log import local_path

if TYPE_CHECKING:
    from ipcount.config import Settings

__all__ = [
    "StateFile",
    "StateStoreFigures",
    "SnapshotRule",
    "figures_of",
    "list_local_state",
    "snapshot_problem",
    "StateStorePoller",
    "state_store_poller",
]

logger = logging.getLogger(__name__)

# `<version>.changelog` / `<version>.zip`, or `<version>_<unique id>.…` (checkpoint format v2).
_VERSIONED = re.compile(r"^(\d+)(?:_[^.]*)?\.(changelog|zip|delta|snapshot)$")


@dataclass(frozen=True)
class StateFile:
    """One file under the checkpoint's state/ directory."""

    path: str  # relative to state/
    size: int
    mtime: float


@dataclass(frozen=True)
class StateStoreFigures:
    """What the state/ directory holds now.

    Attributes:
        files, bytes: every file under state/ (SSTs, changelogs, snapshots, metadata).
        changelogs, snapshots: versioned changelog (or HDFS delta) and snapshot files.
        latest_version: the newest version any store partition has written (0: none yet).
        snapshot_version: the oldest "newest snapshot" across the store partitions (0: some
            partition has none yet): the partition furthest from a snapshot decides.
        lag_versions: versions written since that snapshot, in that partition.
        unsnapshotted_since: mtime of the first file written after that snapshot, in that
            partition (None: nothing since it).
        partitions: store partitions seen.
    """

    files: int = 0
    bytes: int = 0
    changelogs: int = 0
    snapshots: int = 0
    latest_version: int = 0
    snapshot_version: int = 0
    lag_versions: int = 0
    unsnapshotted_since: float | None = None
    partitions: int = 0
    worst_partition: str = ""


@dataclass(frozen=True)
class SnapshotRule:
    """When missing snapshots mean the store is degraded: more than `max_lag_versions` versions
    since the last snapshot in some partition, for longer than `max_age_seconds`. Spark snapshots
    every spark.sql.streaming.stateStore.minDeltasForSnapshot versions, uploaded by maintenance
    every spark.sql.streaming.stateStore.maintenanceInterval: the defaults are three of each."""

    max_lag_versions: int = 30
    max_age_seconds: float = 180.0

    @classmethod
    def from_spark(cls, min_deltas: int, maintenance_seconds: float) -> SnapshotRule:
        return cls(max(3, 3 * min_deltas), max(10.0, 3 * maintenance_seconds))


def figures_of(files: Iterable[StateFile]) -> StateStoreFigures:
    """Figures of a state/ listing (paths `<operator>/<partition>/[<store>/]<file>`)."""
    count = size = changelogs = snapshots = 0
    # partition dir -> (newest version, newest snapshot version, [(version, mtime)])
    parts: dict[str, tuple[int, int, list[tuple[int, float]]]] = {}
    for f in files:
        count += 1
        size += f.size
        head, _, name = f.path.rpartition("/")
        m = _VERSIONED.match(name)
        if m is None:
            continue
        version, kind = int(m.group(1)), m.group(2)
        newest, snap, written = parts.get(head, (0, 0, []))
        if kind in ("zip", "snapshot"):
            snapshots += 1
            snap = max(snap, version)
        else:
            changelogs += 1
            written.append((version, f.mtime))
        parts[head] = (max(newest, version), snap, written)
    if not parts:
        return StateStoreFigures(files=count, bytes=size)
    worst = min(parts, key=lambda p: (parts[p][1], -parts[p][0]))
    newest, snap, written = parts[worst]
    after = [mtime for version, mtime in written if version > snap]
    return StateStoreFigures(
        files=count,
        bytes=size,
        changelogs=changelogs,
        snapshots=snapshots,
        latest_version=max(v[0] for v in parts.values()),
        snapshot_version=snap,
        lag_versions=max(0, newest - snap),
        unsnapshotted_since=min(after) if after else None,
        partitions=len(parts),
        worst_partition=worst,
    )


def snapshot_problem(figures: StateStoreFigures, rule: SnapshotRule, now: float) -> str:
    """Why the store is degraded ("" when it is not): snapshots have stopped in a partition."""
    if figures.unsnapshotted_since is None or figures.lag_versions <= rule.max_lag_versions:
        return ""
    age = now - figures.unsnapshotted_since
    if age <= rule.max_age_seconds:
        return ""
    last = f"version {figures.snapshot_version}" if figures.snapshot_version else "none yet"
    return (
        f"state snapshots are not being written: store {figures.worst_partition} has "
        f"{figures.lag_versions} versions ({age:.0f}s) since its last snapshot ({last}; limit "
        f"{rule.max_lag_versions} versions and {rule.max_age_seconds:.0f}s); restarts replay all "
        "of them and the checkpoint grows. Spark's log says why ('snapshot maintenance')"
    )


def list_local_state(checkpoint: str) -> list[StateFile] | None:
    """The files under a local (or mounted) checkpoint's state/ directory; None when the
    checkpoint is not on a local path (hdfs://, s3a://: see StateStorePoller)."""
    root = local_path(checkpoint)
    if root is None:
        return None
    state = os.path.join(root, "state")
    found: list[StateFile] = []
    for dirpath, _dirs, names in os.walk(state):
        rel = os.path.relpath(dirpath, state)
        for name in names:
            if name.endswith(".crc"):
                continue
            try:
                st = os.stat(os.path.join(dirpath, name))
            except FileNotFoundError:  # purged while we listed
                continue
            path = name if rel == "." else f"{rel.replace(os.sep, '/')}/{name}"
            found.append(StateFile(path, st.st_size, st.st_mtime))
    return found


class StateStorePoller:
    """Every `interval` seconds: list the state store, hand its figures and any problem to
    `report` (figures, problem). Stops with `stop()`; a listing error is logged, not raised."""

    def __init__(
        self,
        lister: Callable[[], list[StateFile] | None],
        rule: SnapshotRule,
        report: Callable[[StateStoreFigures, str], None],
        interval: float = 30.0,
        wall: Callable[[], float] = time.time,
    ) -> None:
        self.lister, self.rule, self.report, self.interval = lister, rule, report, interval
        self._wall = wall
        self._stop = threading.Event()
        self._said = ""
        self._thread = threading.Thread(target=self._run, name="ipcount-state", daemon=True)

    def start(self) -> StateStorePoller:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()

    def poll_once(self) -> tuple[StateStoreFigures, str] | None:
        files = self.lister()
        if files is None:
            return None
        figures = figures_of(files)
        problem = snapshot_problem(figures, self.rule, self._wall())
        if problem and problem.split(":")[0] != self._said.split(":")[0]:
            logger.warning("%s", problem)
        elif self._said and not problem:
            logger.info("state snapshots are written again (version %d)", figures.snapshot_version)
        self._said = problem
        self.report(figures, problem)
        return figures, problem

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            try:
                if self.poll_once() is None:
                    logger.info("state store not on a local path: its files are not watched")
                    return
            except Exception:  # the job goes on without these figures
                logger.exception("could not read the state store's files")


def _spark_seconds(text: str, default: float) -> float:
    """A Spark time setting ("60s", "1m", "500ms", or bare milliseconds) in seconds."""
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*(ms|s|m|min|h)?\s*", text or "")
    if m is None:
        return default
    scale = {"ms": 0.001, "s": 1.0, "m": 60.0, "min": 60.0, "h": 3600.0}[m.group(2) or "ms"]
    return float(m.group(1)) * scale


def state_store_poller(
    settings: Settings, report: Callable[[StateStoreFigures, str], None]
) -> StateStorePoller:
    """The watch on the counting query's state store, with Spark's snapshot settings."""
    conf = settings.spark.conf
    deltas = conf.get("spark.sql.streaming.stateStore.minDeltasForSnapshot", "10")
    maintenance = _spark_seconds(
        conf.get("spark.sql.streaming.stateStore.maintenanceInterval", "60s"), 60.0
    )
    rule = SnapshotRule.from_spark(int(deltas) if deltas.isdigit() else 10, maintenance)
    checkpoint = settings.job.checkpoint_location
    return StateStorePoller(
        lambda: list_local_state(checkpoint),
        rule,
        report,
        interval=min(30.0, max(1.0, maintenance)),
    )
