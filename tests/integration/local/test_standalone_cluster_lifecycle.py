"""The local Spark standalone cluster the chaos runs and the cluster tests start: a second start of
a running cluster is refused (it would lose track of the running daemons, which then outlive every
stop), and a stop leaves none of its processes behind."""

from __future__ import annotations

from pathlib import Path

import pytest

from ipcount.childproc import pid_alive, session_processes
from ipcount.errors import IpcountError
from ipcount.local.cluster import StandaloneCluster

ROOT = Path(__file__).resolve().parents[3]


def test_a_running_cluster_refuses_a_second_start_and_its_stop_leaves_nothing(
    tmp_path: Path,
) -> None:
    cluster = StandaloneCluster(
        tmp_path, workers=1, cores=1, memory="1g", conf_dir=ROOT / "conf"
    ).start()
    try:
        daemons = [cluster.master, *cluster.workers]
        pids = [d.child.pid for d in daemons if d is not None]
        assert len(pids) == 2 and all(pid_alive(p) for p in pids)
        with pytest.raises(IpcountError, match="running already"):
            cluster.start()
        assert [d.child.pid for d in [cluster.master, *cluster.workers] if d] == pids
    finally:
        cluster.stop()
    assert not any(pid_alive(p) or session_processes(p) for p in pids)
