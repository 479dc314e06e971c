"""`ipcount broker start|stop|status`: the local broker (Apache Kafka or noida-db) for development
and the demo, or a local replicated Apache Kafka cluster (`--nodes 3`)."""

from __future__ import annotations

import argparse
import dataclasses

from ipcount.commands import SubParsers, add_action_parser
from ipcount.config import Settings
from ipcount.errors import BrokerError, ConfigError
from ipcount.local.broker import LocalBroker
from ipcount.local.kafka_jars import KAFKA_VERSION
from ipcount.local.kinds import BROKER_KINDS, configured_broker
from ipcount.local.kraft_cluster import MAX_NODES, KafkaCluster

__all__ = ["register"]


def register(sub: SubParsers) -> None:
    p = add_action_parser(
        sub,
        "broker",
        ["start", "stop", "status"],
        help="run the local development broker (Apache Kafka or noida-db)",
        description="Start, stop or check the local Kafka broker configured in [broker].",
    )
    p.add_argument(
        "--kind",
        choices=BROKER_KINDS,
        help="kafka (Apache Kafka, KRaft) or noida-db (JVM-free stand-in); default: broker.kind",
    )
    p.add_argument(
        "--nodes",
        type=int,
        help="start: that many Apache Kafka KRaft nodes on free ports, a replicated cluster "
        f"(2-{MAX_NODES}; 3 = production's shape: replication factor 3, min.insync.replicas 2); "
        "default 1, or the cluster broker.data_dir holds. stop and status find the cluster there",
    )
    p.set_defaults(func=run)


def _broker(settings: Settings, kind: str | None) -> LocalBroker:
    if kind is not None:
        settings = dataclasses.replace(
            settings, broker=dataclasses.replace(settings.broker, kind=kind)
        )
    return configured_broker(settings)


def _cluster(args: argparse.Namespace, settings: Settings) -> KafkaCluster | None:
    """The local cluster to act on: a new one (`--nodes` 2 or more), the one broker.data_dir
    holds, or None (the single broker)."""
    b = settings.broker
    version = b.kafka_version or KAFKA_VERSION
    timeout_ms = b.transaction_max_timeout_ms
    found = KafkaCluster.found_in(
        b.data_dir, version=version, transaction_max_timeout_ms=timeout_ms
    )
    nodes = getattr(args, "nodes", None)
    if nodes is None or args.action != "start":
        return found
    if nodes == 1:
        if found is not None:
            raise BrokerError(
                f"{found.data_dir} holds a local {found.nodes}-node cluster; start it with "
                f"--nodes {found.nodes}, or give the single broker another broker.data_dir"
            )
        return None
    kind = args.kind or b.kind
    if kind != "kafka":
        raise ConfigError(
            f"--nodes {nodes} needs Apache Kafka (broker.kind = 'kafka', or --kind kafka); "
            f"{kind} runs as a single node"
        )
    return KafkaCluster(
        b.data_dir, nodes, b.host, version=version, transaction_max_timeout_ms=timeout_ms
    )


def run(args: argparse.Namespace, settings: Settings) -> int:
    cluster = _cluster(args, settings)
    if cluster is not None:
        return _run_cluster(args.action, cluster, settings)
    broker = _broker(settings, args.kind)
    if args.action == "start":
        pid = broker.start(timeout=settings.broker.start_timeout_seconds)
        print(
            f"{broker.kind} broker running: pid {pid}, bootstrap {broker.bootstrap}, "
            f"data dir {broker.data_dir}"
        )
        _bootstrap_note(settings, broker.bootstrap)
        return 0
    if args.action == "stop":
        stale = broker.stale_reason()
        if broker.stop():
            print(f"broker stopped (data kept in {broker.data_dir})")
        elif stale:
            print(f"nothing stopped: {stale}; removed the stale state file")
        else:
            print(f"no broker running for data dir {broker.data_dir}")
        return 0
    status = broker.status()
    if status.running:
        print(
            f"running: pid {status.pid}, bootstrap {status.bootstrap}, data dir {status.data_dir}"
        )
        return 0
    print(f"not running (data dir {status.data_dir})")
    return 3


def _bootstrap_note(settings: Settings, bootstrap: str) -> None:
    if settings.kafka.bootstrap_servers != bootstrap:
        print(
            f"note: kafka.bootstrap_servers is {settings.kafka.bootstrap_servers}; "
            f"set IPCOUNT_KAFKA_BOOTSTRAP_SERVERS={bootstrap} to use this broker"
        )


def _run_cluster(action: str, cluster: KafkaCluster, settings: Settings) -> int:
    if action == "start":
        # The nodes start together and wait for each other: give the whole a node's time twice.
        cluster.start(timeout=2 * settings.broker.start_timeout_seconds)
        pids = ", ".join(str(s.pid) for s in cluster.status())
        print(
            f"kafka cluster running: {cluster.nodes} nodes (pids {pids}), data dir "
            f"{cluster.data_dir}\nbootstrap {cluster.bootstrap}"
        )
        _bootstrap_note(settings, cluster.bootstrap)
        return 0
    if action == "stop":
        if cluster.stop():
            print(f"cluster stopped: {cluster.nodes} nodes (data kept in {cluster.data_dir})")
        else:
            print(f"no node of the cluster in {cluster.data_dir} was running")
        return 0
    statuses = cluster.status()
    for n, status in enumerate(statuses, start=1):
        state = f"running: pid {status.pid}" if status.running else "not running"
        print(f"node {n}: {state}, bootstrap {status.bootstrap}, data dir {status.data_dir}")
    up = sum(s.running for s in statuses)
    print(f"{up} of {cluster.nodes} nodes running; bootstrap {cluster.bootstrap}")
    return 0 if up == cluster.nodes else 3
