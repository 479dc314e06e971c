"""A short cluster round: `ipcount run` against a local three-node Apache Kafka cluster (`ipcount
broker start --nodes 3`), the leader of the sink's partition 0 SIGKILLed while records flow, then
(with that node back) the transaction coordinator of the job's transactional.id; the output stays
exact."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import KafkaException
from confluent_kafka.admin import AdminClient

from ipcount.chaos.cluster_faults import coordinator_node, counting_transactional_id
from ipcount.chaos.processes import last_committed_batch
from ipcount.config import load_settings
from ipcount.kafka.topics import ensure_topics
from ipcount.local.kraft_cluster import KafkaCluster
from ipcount.verify.compare import verify_sink

ROOT = Path(__file__).resolve().parents[2]


def _wait(what: str, cond: Any, timeout: float) -> float:
    """Wait for `cond()`; the seconds it took."""
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout:
        if cond():
            return time.monotonic() - t0
        time.sleep(0.2)
    raise AssertionError(f"timed out after {timeout:g}s waiting for {what}")


def _led_without(admin: AdminClient, node: int, *topics: str) -> bool:
    """Whether every partition of `topics` has a leader other than `node`; False while the
    metadata request itself times out (the client may still be asking the dead node)."""
    try:
        return all(
            p.leader not in (node, -1)
            for name in topics
            for p in admin.list_topics(name, timeout=10).topics[name].partitions.values()
        )
    except KafkaException:
        return False


def test_ipcount_run_is_exact_through_a_leader_kill_on_three_nodes(
    tmp_path: Path, broker_kind: str, Feed: Any, ipcount_env: Any, ipcount_cli: Any
) -> None:
    if broker_kind != "kafka":
        pytest.skip("a local cluster is Apache Kafka only")
    cluster = KafkaCluster(tmp_path / "cluster", 3)
    cluster.start(timeout=120)
    try:
        tag = uuid.uuid4().hex[:8]
        checkpoint = tmp_path / "ckpt"
        settings = load_settings(
            ROOT / "conf" / "ipcount.toml",
            env={},
            overrides=[
                f"kafka.bootstrap_servers={cluster.bootstrap}",
                f"topics.source=src-{tag}",
                f"topics.sink=sink-{tag}",
                f"topics.progress=progress-{tag}",
                f"topics.late=late-{tag}",
                f"topics.dead_letter=dlq-{tag}",
                f"job.checkpoint_location={checkpoint}",
            ],
        )
        ensure_topics(settings)
        feed = Feed(settings)
        feed.round(0, 20)
        log = tmp_path / "job.log"
        env = ipcount_env(settings, {"IPCOUNT_JOB_RESTART_DELAY_SECONDS": "2"})
        with log.open("w") as err:
            job = subprocess.Popen(
                [sys.executable, "-m", "ipcount", "run"],
                env=env,
                cwd=ROOT,
                stdout=subprocess.DEVNULL,
                stderr=err,
            )
        try:
            _wait("a first committed batch", lambda: last_committed_batch(checkpoint), 180)
            admin = AdminClient({"bootstrap.servers": cluster.bootstrap})
            leader = admin.list_topics(timeout=10).topics[settings.topics.sink].partitions[0].leader
            cluster.node(leader).kill()
            before = last_committed_batch(checkpoint) or 0
            feed.round(20, 40)
            # Records of the second round are counted: the job went on without the dead leader.
            after = _wait(
                "batches after the leader's kill",
                lambda: (last_committed_batch(checkpoint) or 0) >= before + 2,
                120,
            )
            assert job.poll() is None, log.read_text()[-3000:]
            # The leader comes back; then the coordinator of the job's transactional.id dies.
            cluster.node(leader).start(timeout=120)
            # As an operator would: the next node goes only once every replica is in sync again.
            cluster.wait_in_sync(120)
            tid = counting_transactional_id(log.read_text(), checkpoint)
            assert tid is not None, log.read_text()[-3000:]
            coordinator = coordinator_node(cluster.bootstrap, tid)
            before = last_committed_batch(checkpoint) or 0
            feed.round(40, 50)
            cluster.node(coordinator).kill()
            # Records of the next round go out once no partition is led by the dead node (what
            # the job does meanwhile is the point: it works through the round before).
            _wait(
                f"partitions led by others than node {coordinator}",
                lambda: _led_without(
                    admin, coordinator, settings.topics.source, settings.topics.sink
                ),
                60,
            )
            feed.round(50, 60)
            after_coordinator = _wait(
                "batches after the coordinator's kill",
                lambda: (last_committed_batch(checkpoint) or 0) >= before + 2,
                120,
            )
            assert job.poll() is None, log.read_text()[-3000:]
            # The input is finished: the job's idle heartbeats close the last windows, with the
            # coordinator still down (no other run on the checkpoint).
            _wait(
                "every window's result",
                lambda: verify_sink(settings, feed.ledger, deadline_seconds=30).exact,
                180,
            )
            assert job.poll() is None, log.read_text()[-3000:]
        finally:
            job.send_signal(signal.SIGTERM)
            job.wait(90)
        text = log.read_text(encoding="utf-8", errors="replace")
        assert job.returncode == 0, text[-3000:]
        last = feed.verify(ipcount_cli, tmp_path)
        assert last.endswith("exact=true"), last
        restarts = [line for line in text.splitlines() if "restarting the query" in line]
        print(
            f"leader {leader} killed: two more batches in {after:.1f}s; coordinator "
            f"{coordinator} of {tid} killed: two more batches in {after_coordinator:.1f}s"
        )
        # What the two kills cost the job: said, not asserted. Leader and coordinator moves
        # mostly cost a retry, but an offset lookup of the source can still answer "unknown"
        # (-1001) for longer than its 30 s and restart the query (issue #39, left open).
        print(f"query restarts: {len(restarts)}", *restarts, sep="\n")
    finally:
        cluster.stop()
