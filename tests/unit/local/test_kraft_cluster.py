"""A local cluster's layout and each node's configuration (no JVM: the nodes are not started; the
cluster itself runs in tests/integration/local/test_kafka_cluster.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from ipcount.config import load_settings
from ipcount.errors import BrokerError
from ipcount.kafka.topics import replication_factor
from ipcount.local.kraft import KafkaBroker
from ipcount.local.kraft_cluster import KafkaCluster


def test_three_nodes_form_one_quorum_with_production_s_replication(tmp_path: Path) -> None:
    cluster = KafkaCluster(tmp_path, 3)
    nodes = cluster.members()
    props = [n.server_properties(n._controller_port()) for n in nodes]
    assert [p["node.id"] for p in props] == ["1", "2", "3"]
    voters = {p["controller.quorum.voters"] for p in props}
    assert len(voters) == 1 and voters.pop().count("@") == 3  # the same quorum of three
    for p in props:
        assert p["default.replication.factor"] == "3"
        assert p["min.insync.replicas"] == "2"
        assert p["transaction.state.log.replication.factor"] == "3"
        assert p["transaction.state.log.min.isr"] == "2"
        assert p["offsets.topic.replication.factor"] == "3"
    ports = [n.port for n in nodes] + [n._controller_port() for n in nodes]
    assert len(set(ports)) == 6
    assert cluster.bootstrap == ",".join(f"127.0.0.1:{n.port}" for n in nodes)
    assert len({n.cluster_id for n in nodes}) == 1


def test_a_restart_finds_the_nodes_where_they_were(tmp_path: Path) -> None:
    assert KafkaCluster.found_in(tmp_path) is None
    first = KafkaCluster(tmp_path, 3)
    first.members()  # a start lays the cluster out
    again = KafkaCluster.found_in(tmp_path)
    assert again is not None and again.nodes == 3
    assert again.bootstrap == first.bootstrap
    assert again.node(2).voters == first.node(2).voters
    with pytest.raises(BrokerError, match="has 3 nodes, not 5: start it with --nodes 3"):
        KafkaCluster(tmp_path, 5).members()


def test_a_single_node_stays_as_it_was(tmp_path: Path) -> None:
    props = KafkaBroker(tmp_path, port=9092).server_properties(9093)
    assert props["node.id"] == "1"
    assert props["controller.quorum.voters"] == "1@127.0.0.1:9093"
    assert props["min.insync.replicas"] == "1"
    assert props["transaction.state.log.replication.factor"] == "1"


def test_a_cluster_never_shares_a_single_broker_s_data_dir(tmp_path: Path) -> None:
    (tmp_path / "server.properties").write_text("node.id=1\n", encoding="utf-8")
    with pytest.raises(BrokerError, match="holds a single-node broker"):
        KafkaCluster(tmp_path, 3).members()


@pytest.mark.parametrize(
    ("setting", "brokers", "expected"), [(0, 1, 1), (0, 3, 3), (0, 5, 3), (2, 3, 2), (1, 3, 1)]
)
def test_topics_get_the_cluster_s_size_unless_told_otherwise(
    setting: int, brokers: int, expected: int
) -> None:
    settings = load_settings(
        env={}, overrides=[f"topics.replication_factor={setting}"], use_default_path=False
    )
    assert replication_factor(settings, brokers) == expected


def test_a_cluster_is_apache_kafka_only(tmp_path: Path) -> None:
    from argparse import Namespace

    from ipcount.commands import broker
    from ipcount.errors import ConfigError

    settings = load_settings(
        env={},
        overrides=[f"broker.data_dir={tmp_path}", "broker.kind=noida-db"],
        use_default_path=False,
    )
    with pytest.raises(ConfigError, match="--nodes 3 needs Apache Kafka"):
        broker.run(Namespace(action="start", kind=None, nodes=3), settings)
    KafkaCluster(tmp_path, 3).members()  # a cluster laid out here
    with pytest.raises(BrokerError, match="holds a local 3-node cluster; start it with --nodes 3"):
        broker.run(Namespace(action="start", kind="kafka", nodes=1), settings)
