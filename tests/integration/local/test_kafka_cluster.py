"""`ipcount broker start --nodes 3`: a local replicated Apache Kafka cluster (three KRaft nodes), as
a user runs it from the CLI, losing a partition leader to SIGKILL while transactions go on."""

from __future__ import annotations

import os
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, ConfigResource, ResourceType

from ipcount.childproc import pid_alive
from ipcount.kafka.watermarks import partition_offsets
from ipcount.local.kraft_cluster import KafkaCluster
from ipcount.source.offset_reader import KafkaOffsetReader

ROOT = Path(__file__).resolve().parents[3]

pytestmark = pytest.mark.slow


def _cli(*args: str, env: dict[str, str], timeout: float = 180) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "ipcount", *args],
        capture_output=True,
        text=True,
        env={**os.environ, **env},
        cwd=ROOT,
        timeout=timeout,
    )


def _committed(bootstrap: str, topic: str, partition: int, count: int) -> list[bytes]:
    """What a read_committed consumer reads from the start of `topic`[`partition`]."""
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"check-{uuid.uuid4().hex[:8]}",
            "isolation.level": "read_committed",
            "enable.auto.commit": False,
        }
    )
    try:
        consumer.assign([TopicPartition(topic, partition, 0)])
        got: list[bytes] = []
        deadline = time.monotonic() + 30
        while len(got) < count and time.monotonic() < deadline:
            for msg in consumer.consume(100, 0.5):
                if msg.error() is None:
                    got.append(msg.value() or b"")
        return got
    finally:
        consumer.close()


def test_a_three_node_cluster_keeps_transactions_through_a_leader_kill(
    tmp_path: Path, broker_kind: str
) -> None:
    if broker_kind != "kafka":
        pytest.skip("a local cluster is Apache Kafka only")
    tag = uuid.uuid4().hex[:8]
    env = {
        "IPCOUNT_BROKER_KIND": "kafka",
        "IPCOUNT_BROKER_DATA_DIR": str(tmp_path / "cluster"),
        "IPCOUNT_TOPICS_SOURCE": f"src-{tag}",
        "IPCOUNT_TOPICS_SINK": f"sink-{tag}",
        "IPCOUNT_TOPICS_PROGRESS": f"progress-{tag}",
        "IPCOUNT_TOPICS_LATE": f"late-{tag}",
        "IPCOUNT_TOPICS_DEAD_LETTER": f"dlq-{tag}",
    }
    started = _cli("broker", "start", "--nodes", "3", env=env)
    cluster = KafkaCluster.found_in(tmp_path / "cluster")
    try:
        assert started.returncode == 0, started.stderr[-3000:]
        assert cluster is not None and cluster.nodes == 3
        pids = [s.pid for s in cluster.status()]
        assert all(pids), pids
        bootstrap = cluster.bootstrap
        assert f"bootstrap {bootstrap}" in started.stdout
        assert len(bootstrap.split(",")) == 3
        env["IPCOUNT_KAFKA_BOOTSTRAP_SERVERS"] = bootstrap

        # topics.replication_factor = 0 (default): the cluster's size.
        created = _cli("topics", "create", env=env)
        assert created.returncode == 0, created.stderr[-3000:]
        admin = AdminClient({"bootstrap.servers": bootstrap})
        md = admin.list_topics(timeout=10)
        assert len(md.brokers) == 3
        sink = f"sink-{tag}"
        topics = [f"src-{tag}", sink, f"progress-{tag}", f"late-{tag}", f"dlq-{tag}"]
        for name in topics:
            for part in md.topics[name].partitions.values():
                assert len(part.replicas) == 3, (name, part.replicas)
        resources = [ConfigResource(ResourceType.TOPIC, t) for t in topics]
        resources.append(ConfigResource(ResourceType.BROKER, "1"))
        configs = {r.name: f.result() for r, f in admin.describe_configs(resources).items()}
        for name in topics:
            assert configs[name]["min.insync.replicas"].value == "2", name
        broker = configs["1"]
        assert broker["transaction.state.log.replication.factor"].value == "3"
        assert broker["transaction.state.log.min.isr"].value == "2"
        assert broker["offsets.topic.replication.factor"].value == "3"

        producer = Producer(
            {"bootstrap.servers": bootstrap, "transactional.id": f"txn-{tag}", "acks": "all"}
        )
        producer.init_transactions(30)
        producer.begin_transaction()
        producer.produce(sink, b"before", partition=0)
        producer.commit_transaction(30)

        # SIGKILL the leader of the sink's partition 0, by its PID.
        leader = md.topics[sink].partitions[0].leader
        victim = cluster.node(leader)
        victim_pid = victim.pid
        assert victim_pid is not None
        victim.kill()
        assert not pid_alive(victim_pid)
        t0 = time.monotonic()
        producer.begin_transaction()
        producer.produce(sink, b"after", partition=0)
        producer.commit_transaction(60)
        commit_s = time.monotonic() - t0
        # commit_transaction returns once the coordinator has logged the commit; it writes the
        # marker to the partition after that, and a new leader's high watermark follows its ISR:
        # the end reaches 4 (two records, two commit markers) a moment later (once seen in CI).
        probe = Consumer({"bootstrap.servers": bootstrap, "group.id": f"probe-{tag}"})
        try:
            deadline = time.monotonic() + 30
            _, end = partition_offsets(probe, sink, 0, timeout=30)
            while end < 4 and time.monotonic() < deadline:
                time.sleep(0.2)
                _, end = partition_offsets(probe, sink, 0, timeout=30)
        finally:
            probe.close()
        assert end >= 4  # two records and two commit markers
        assert _committed(bootstrap, sink, 0, 2) == [b"before", b"after"]
        new_leader = admin.list_topics(timeout=10).topics[sink].partitions[0].leader
        assert new_leader not in (leader, -1)
        print(f"leader {leader} killed; the next transaction committed in {commit_s:.1f}s")

        status = _cli("broker", "status", env=env)
        assert status.returncode == 3 and "2 of 3 nodes running" in status.stdout, status.stdout
        # `broker start` brings the killed node back; the cluster is whole again.
        again = _cli("broker", "start", "--nodes", "3", env=env)
        assert again.returncode == 0, again.stderr[-3000:]
        assert _cli("broker", "status", env=env).returncode == 0
        pids = [s.pid for s in cluster.status()]
    finally:
        stopped = _cli("broker", "stop", env=env)
    assert stopped.returncode == 0 and "cluster stopped: 3 nodes" in stopped.stdout, stopped
    assert not any(pid is not None and pid_alive(pid) for pid in pids), pids


def test_the_sources_offset_lookups_ride_through_a_leader_that_comes_back(
    tmp_path: Path, broker_kind: str
) -> None:
    """The driver's latest-offset lookup (what plans every micro-batch) holds a leader and epoch
    from its last metadata; the leader is killed, and after it restarts it is elected again (as
    Kafka's preferred-leader rebalance does): the old leader now answers the stale epoch with
    FENCED_LEADER_EPOCH. The lookup must refresh its metadata and answer, not fail the query."""
    if broker_kind != "kafka":
        pytest.skip("a local cluster is Apache Kafka only")
    from confluent_kafka import ElectionType

    with _source_on_a_cluster(tmp_path) as (cluster, admin, producer, reader, topic):
        leader = admin.list_topics(topic, timeout=10).topics[topic].partitions[0].leader
        cluster.node(leader).kill()
        deadline = time.monotonic() + 60
        while admin.list_topics(topic, timeout=10).topics[topic].partitions[0].leader in (
            leader,
            -1,
        ):
            assert time.monotonic() < deadline, "no new leader"
            time.sleep(0.5)
        # The killed node's replicas are out of sync while it is down: a bounded wait says so.
        assert not cluster.wait_in_sync(1)
        cluster.node(leader).start(timeout=120)
        tp = TopicPartition(topic, 0)
        # Every replica of every partition back in sync (what a rolling restart waits for).
        assert cluster.wait_in_sync(60), "the restarted node did not catch up within 60 s"
        part = admin.list_topics(topic, timeout=10).topics[topic].partitions[0]
        assert sorted(part.isrs) == [1, 2, 3], part.isrs
        admin.elect_leaders(ElectionType.PREFERRED, [tp]).result(30)
        while admin.list_topics(topic, timeout=10).topics[topic].partitions[0].leader != leader:
            assert time.monotonic() < deadline + 120, "the preferred leader was not elected"
            time.sleep(0.5)
        for _ in range(3):
            producer.produce(topic, b"y", partition=0)
        assert producer.flush(30) == 0
        t0 = time.monotonic()
        assert reader.offsets([(topic, 0)], "latest") == {(topic, 0): 8}
        print(f"latest offset looked up {time.monotonic() - t0:.1f}s after the leader's return")


def test_the_sources_latest_offsets_answer_soon_after_their_leader_is_killed(
    tmp_path: Path, broker_kind: str
) -> None:
    """The node leading the source's partition is SIGKILLed and stays down. librdkafka's admin
    ListOffsets sends to the leader its metadata names and waits for that node to come back for
    the whole request timeout, then answers the partition "unknown" (-1001). The next
    micro-batch's lookup must answer the log's end soon after a new leader is elected, not fail
    the query after 30 s."""
    if broker_kind != "kafka":
        pytest.skip("a local cluster is Apache Kafka only")
    with _source_on_a_cluster(tmp_path) as (cluster, admin, producer, reader, topic):
        leader = admin.list_topics(topic, timeout=10).topics[topic].partitions[0].leader
        cluster.node(leader).kill()
        t0 = time.monotonic()
        assert reader.offsets([(topic, 0)], "latest") == {(topic, 0): 5}
        took = time.monotonic() - t0
        new_leader = admin.list_topics(topic, timeout=10).topics[topic].partitions[0].leader
        assert new_leader not in (leader, -1)
        print(f"leader {leader} killed: latest offset answered after {took:.1f}s")
        # The broker fences a dead node after broker.session.timeout.ms (4 s locally) and
        # elects a new leader; the lookup may take one more short attempt after that.
        assert took < 15, took
        assert reader.offsets([(topic, 0)], "earliest") == {(topic, 0): 0}


@contextmanager
def _source_on_a_cluster(
    tmp_path: Path,
) -> Iterator[tuple[KafkaCluster, AdminClient, Producer, KafkaOffsetReader, str]]:
    """A three-node cluster with a source topic of one partition on all three (5 records in it)
    and the source's driver-side offset reader, which has looked up its end once."""
    from confluent_kafka.admin import NewTopic

    from ipcount.source.options import parse_options

    cluster = KafkaCluster(tmp_path / "cluster", 3)
    cluster.start(timeout=120)
    try:
        bootstrap, topic = cluster.bootstrap, f"src-{uuid.uuid4().hex[:8]}"
        admin = AdminClient({"bootstrap.servers": bootstrap})
        admin.create_topics([NewTopic(topic, 1, 3)])[topic].result(30)
        producer = Producer({"bootstrap.servers": bootstrap, "acks": "all"})
        for _ in range(5):
            producer.produce(topic, b"x", partition=0)
        assert producer.flush(30) == 0
        reader = KafkaOffsetReader(
            parse_options({"kafka.bootstrap.servers": bootstrap, "subscribe": topic})
        )
        try:
            assert reader.offsets([(topic, 0)], "latest") == {(topic, 0): 5}
            yield cluster, admin, producer, reader, topic
        finally:
            reader.close()
    finally:
        cluster.stop()
