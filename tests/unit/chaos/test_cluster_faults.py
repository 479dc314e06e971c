"""Finding whom a cluster fault strikes: the transaction coordinator of a transactional.id (as
Kafka maps it) and the active KRaft controller (from the nodes' quorum-state files)."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from ipcount.chaos.cluster_faults import active_controller, coordinator_partition, java_string_hash


def test_java_string_hash_matches_java() -> None:
    # Values of java.lang.String#hashCode.
    assert java_string_hash("") == 0
    assert java_string_hash("a") == 97
    assert java_string_hash("hello") == 99162322
    assert java_string_hash("ipcount-3f2c") == 190439081
    assert java_string_hash("ipcount-0b5e2a8c-1f7e-4d2a-9c1e-2f4b6a8d0e1c") == -874161985
    assert java_string_hash("polygenelubricants") == -(2**31)
    assert java_string_hash("é") == 233


def test_coordinator_partition_is_kafkas_partition_for() -> None:
    # Utils.abs(Integer.MIN_VALUE) is 0, not MIN_VALUE.
    assert coordinator_partition("polygenelubricants", 50) == 0
    assert coordinator_partition("ipcount-3f2c", 3) == 190439081 % 3 == 2
    assert coordinator_partition("ipcount-0b5e2a8c-1f7e-4d2a-9c1e-2f4b6a8d0e1c", 50) == 35
    assert coordinator_partition("hello", 50) == 99162322 % 50


def test_active_controller_is_the_leader_of_the_newest_epoch(tmp_path: Path) -> None:
    nodes: list[Any] = []
    for n, state in (
        (1, {"leaderId": 2, "leaderEpoch": 4}),
        (2, {"leaderId": 3, "leaderEpoch": 5}),
    ):
        meta = tmp_path / f"n{n}" / "__cluster_metadata-0"
        meta.mkdir(parents=True)
        (meta / "quorum-state").write_text(json.dumps({**state, "votedId": -1}))
        nodes.append(SimpleNamespace(log_dir=tmp_path / f"n{n}"))
    nodes.append(SimpleNamespace(log_dir=tmp_path / "n3"))  # no file (yet): ignored
    assert active_controller(nodes) == 3
    assert active_controller(nodes[2:]) is None
