"""A local replicated Apache Kafka cluster: N KRaft nodes (each a combined broker and controller,
a controller quorum of N) on free ports, under one data dir, each started and stopped by its PID
like the single local broker. Three nodes make production's shape on one machine: topics with
three replicas, two in sync for an acknowledged write, the transaction state log likewise."""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from ipcount.errors import BrokerError
from ipcount.kafka.client import admin_client, wait_for_metadata
from ipcount.local.broker import BrokerStatus, free_port
from ipcount.local.kafka_jars import KAFKA_VERSION
from ipcount.local.kraft import KafkaBroker, new_cluster_id

__all__ = ["KafkaCluster", "LAYOUT_FILE", "MAX_NODES"]

logger = logging.getLogger(__name__)

# In the cluster's data dir: the node count, ports and cluster id chosen at its first start, so a
# restart finds every node (and its controller quorum) where it was formatted.
LAYOUT_FILE = "ipcount-cluster.json"
MAX_NODES = 9


class KafkaCluster:
    """`nodes` KRaft nodes under `data_dir` (node i in `node-i`), on ports chosen at the first
    start and kept in LAYOUT_FILE."""

    kind = "kafka"
    durable_kill = True

    def __init__(
        self,
        data_dir: str | Path,
        nodes: int,
        host: str = "127.0.0.1",
        *,
        version: str = KAFKA_VERSION,
        transaction_max_timeout_ms: int = 900_000,
    ) -> None:
        if not 2 <= nodes <= MAX_NODES:
            raise BrokerError(f"a local cluster has 2 to {MAX_NODES} nodes, not {nodes}")
        self.data_dir = Path(data_dir).resolve()
        self.host = host
        self.nodes = nodes
        self.version = version
        self.transaction_max_timeout_ms = transaction_max_timeout_ms
        self._members: list[KafkaBroker] | None = None

    def __repr__(self) -> str:
        return f"KafkaCluster({self.nodes} nodes, data_dir={str(self.data_dir)!r})"

    @classmethod
    def found_in(
        cls,
        data_dir: str | Path,
        *,
        version: str = KAFKA_VERSION,
        transaction_max_timeout_ms: int = 900_000,
    ) -> KafkaCluster | None:
        """The cluster laid out in `data_dir` by an earlier start, or None."""
        layout = _read_layout(Path(data_dir).resolve())
        if layout is None:
            return None
        return cls(
            data_dir,
            int(str(layout["nodes"])),
            str(layout["host"]),
            version=version,
            transaction_max_timeout_ms=transaction_max_timeout_ms,
        )

    @property
    def layout_file(self) -> Path:
        return self.data_dir / LAYOUT_FILE

    def members(self) -> list[KafkaBroker]:
        """The nodes, node 1 first (their ports fixed at the first call of a new cluster)."""
        if self._members is None:
            layout = self._layout()
            ports = _ids(layout["ports"])
            voters = _ids(layout["controller_ports"])
            self._members = [
                KafkaBroker(
                    self.data_dir / f"node-{n}",
                    self.host,
                    ports[n],
                    version=self.version,
                    transaction_max_timeout_ms=self.transaction_max_timeout_ms,
                    node_id=n,
                    voters=voters,
                    cluster_id=str(layout["cluster_id"]),
                )
                for n in sorted(ports)
            ]
        return self._members

    def node(self, node_id: int) -> KafkaBroker:
        """The node whose broker id (node.id) is `node_id`."""
        return self.members()[node_id - 1]

    @property
    def bootstrap(self) -> str:
        """Every node's host:port, for kafka.bootstrap_servers."""
        return ",".join(m.bootstrap for m in self.members())

    def status(self) -> list[BrokerStatus]:
        return [m.status() for m in self.members()]

    def start(self, timeout: float = 60.0) -> list[int]:
        """Start every node that is not running, all at once (a node waits for a quorum of
        controllers), and wait until the cluster's metadata lists all nodes.

        Returns:
            The PIDs of the nodes started.

        Raises:
            BrokerError: every node already runs, a port is taken, or the cluster is not whole
                within `timeout` seconds (the nodes started here are stopped again).
        """
        members = self.members()
        down = [m for m in members if not m.status().running]
        if not down:
            pids = ", ".join(str(s.pid) for s in self.status())
            raise BrokerError(
                f"the local {self.nodes}-node cluster is already running (pids {pids}, bootstrap "
                f"{self.bootstrap}, data dir {self.data_dir}); `ipcount broker stop` stops it"
            )
        with ThreadPoolExecutor(len(down), thread_name_prefix="ipcount-kafka-node") as pool:
            results = list(pool.map(lambda m: _start(m, timeout), down))
        failed = [r for r in results if isinstance(r, BrokerError)]
        if failed:
            self._stop(m for m, r in zip(down, results, strict=True) if isinstance(r, int))
            raise failed[0]
        try:
            self.wait_whole(timeout)
        except BrokerError:
            self._stop(down)
            raise
        return [r for r in results if isinstance(r, int)]

    def wait_whole(self, timeout: float) -> None:
        """Wait until the metadata lists every node as a broker.

        Raises:
            BrokerError: not within `timeout` seconds.
        """
        deadline = time.monotonic() + timeout
        seen = 0
        while time.monotonic() < deadline:
            md = wait_for_metadata({"bootstrap.servers": self.bootstrap}, timeout)
            seen = len(md.brokers)
            if seen >= self.nodes:
                return
            time.sleep(0.2)
        raise BrokerError(
            f"the local cluster lists {seen} of its {self.nodes} brokers after {timeout:g}s; "
            f"see the nodes' logs under {self.data_dir}"
        )

    def wait_in_sync(self, timeout: float) -> bool:
        """Wait until every partition has a leader and all its replicas in sync (a rolling restart
        takes the next node only then).

        Returns:
            True once in sync; False after `timeout` seconds (logged with the lagging partitions,
            not raised: a caller riding through faults goes on).
        """
        admin = admin_client({"bootstrap.servers": self.bootstrap})
        deadline = time.monotonic() + timeout
        lagging: list[str] = []
        while time.monotonic() < deadline:
            try:
                md = admin.list_topics(timeout=10)
            except Exception as exc:  # noqa: BLE001 - a cluster still settling: ask again
                logger.info("metadata not yet available: %s", exc)
                time.sleep(0.5)
                continue
            lagging = [
                f"{t.topic}[{p.id}]"
                for t in md.topics.values()
                for p in t.partitions.values()
                if len(p.isrs) < len(p.replicas) or p.leader < 0
            ]
            if not lagging:
                return True
            time.sleep(0.5)
        logger.warning(
            "partitions still not in sync after %gs: %s", timeout, ", ".join(lagging[:10])
        )
        return False

    def stop(self, timeout: float = 30.0) -> bool:
        """Stop every node by its PID, all at once (one at a time, the last would wait for a
        quorum that is gone); False if none was running."""
        return self._stop(self.members(), timeout)

    def _stop(self, nodes: Iterable[KafkaBroker], timeout: float = 30.0) -> bool:
        todo = list(nodes)
        if not todo:
            return False
        with ThreadPoolExecutor(len(todo), thread_name_prefix="ipcount-kafka-stop") as pool:
            return any(list(pool.map(lambda m: m.stop(timeout), todo)))

    def _layout(self) -> dict[str, object]:
        layout = _read_layout(self.data_dir)
        if layout is not None:
            if int(str(layout["nodes"])) != self.nodes:
                raise BrokerError(
                    f"the local cluster in {self.data_dir} has {layout['nodes']} nodes, not "
                    f"{self.nodes}: start it with --nodes {layout['nodes']}, or give the new "
                    "one another broker.data_dir"
                )
            return layout
        for leftover in ("server.properties", "ipcount-broker.json"):
            if (self.data_dir / leftover).exists():
                raise BrokerError(
                    f"{self.data_dir} holds a single-node broker; give the cluster another "
                    "broker.data_dir (env IPCOUNT_BROKER_DATA_DIR)"
                )
        ports = _free_ports(self.host, 2 * self.nodes)
        layout = {
            "nodes": self.nodes,
            "host": self.host,
            "cluster_id": new_cluster_id(),
            "ports": {str(n): ports[n - 1] for n in range(1, self.nodes + 1)},
            "controller_ports": {
                str(n): ports[self.nodes + n - 1] for n in range(1, self.nodes + 1)
            },
        }
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self.layout_file.write_text(json.dumps(layout), encoding="utf-8")
        return layout


def _free_ports(host: str, count: int) -> list[int]:
    """`count` different ports free on `host` now."""
    ports: list[int] = []
    while len(ports) < count:
        port = free_port(host)
        if port not in ports:
            ports.append(port)
    return ports


def _read_layout(data_dir: Path) -> dict[str, object] | None:
    try:
        layout = json.loads((data_dir / LAYOUT_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return layout if isinstance(layout, dict) else None


def _ids(mapping: object) -> dict[int, int]:
    """node id -> port, from the layout file's JSON object."""
    if not isinstance(mapping, dict):
        raise BrokerError(f"the local cluster's {LAYOUT_FILE} is damaged: {mapping!r}")
    return {int(k): int(v) for k, v in mapping.items()}


def _start(node: KafkaBroker, timeout: float) -> int | BrokerError:
    try:
        return node.start(timeout=timeout)
    except BrokerError as exc:
        return exc
