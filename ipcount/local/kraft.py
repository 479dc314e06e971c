"""Apache Kafka as a local broker: one KRaft node (combined controller and broker) from Maven
Central's jars, on a free port with its own data dir; alone, or one node of a local cluster
(`kraft_cluster.KafkaCluster`)."""

from __future__ import annotations

import base64
import logging
import subprocess
import uuid
from pathlib import Path

from ipcount.errors import BrokerError
from ipcount.local.broker import LocalBroker, free_port
from ipcount.local.kafka_jars import KAFKA_VERSION, java_executable, kafka_classpath

__all__ = ["KafkaBroker", "replication_props"]

logger = logging.getLogger(__name__)

# A small broker for a 2-core development machine: measured cold start 3.5-3.8 s, RSS ~250 MB.
# C1-only JIT starts faster than the full tiered compiler; serial GC suits a single small heap.
_JVM_OPTS = ["-Xms256m", "-Xmx512m", "-XX:+UseSerialGC", "-XX:TieredStopAtLevel=1"]

_LOG4J2 = """status = warn
appender.out.type = Console
appender.out.name = OUT
appender.out.layout.type = PatternLayout
appender.out.layout.pattern = [%d] %p %m (%c)%n
rootLogger.level = INFO
rootLogger.appenderRef.out.ref = OUT
logger.controller.name = org.apache.kafka.controller
logger.controller.level = WARN
logger.state.name = state.change.logger
logger.state.level = WARN
"""


def new_cluster_id() -> str:
    """A random KRaft cluster id, as ``kafka-storage random-uuid`` makes it.

    Kafka's ``Uuid.randomUuid`` draws again when the base64url text starts
    with ``-``: the storage tool would read such an id as an option and fail
    (one start in 64).
    """
    while True:
        cluster_id = base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")
        if not cluster_id.startswith("-"):
            return cluster_id


def replication_props(nodes: int) -> dict[str, str]:
    """Replication of a cluster of `nodes`: every topic (the internal ones too) on min(3, nodes)
    brokers; an acknowledged write on two of them from three nodes on (one node: one, and one in
    sync), so one broker can be lost without losing a write or refusing one."""
    rf = str(max(1, min(3, nodes)))
    isr = "2" if nodes >= 3 else "1"
    return {
        "default.replication.factor": rf,
        "min.insync.replicas": isr,
        "offsets.topic.replication.factor": rf,
        "transaction.state.log.replication.factor": rf,
        "transaction.state.log.min.isr": isr,
        "share.coordinator.state.topic.replication.factor": rf,
        "share.coordinator.state.topic.min.isr": isr,
    }


class KafkaBroker(LocalBroker):
    """A KRaft Apache Kafka node (combined broker and controller): alone by default, or node
    `node_id` of a cluster whose controller quorum is `voters` (node id -> controller port),
    formatted with one `cluster_id`.

    Alone, the replication factors and `min.insync.replicas` of the internal topics are 1; in a
    cluster of three or more, 3 and 2 (see `replication_props`). `transaction.max.timeout.ms` is
    configurable, so the sink's start-up check can be tested.
    With `advertised_port` (e.g. a fault proxy's, `fault_proxy.FaultProxy`), clients are told to
    reach the broker there, so every client connection goes through it; the broker's own traffic
    (transaction markers to itself) uses a second listener, INTERNAL on `internal_port` (default:
    a free port), which `internal_bootstrap` names for clients that must bypass the proxy.
    SIGTERM is a controlled shutdown. A SIGKILL ends the process, not the machine: what the broker
    acknowledged is in the OS page cache and survives a restart (`durable_kill`).
    """

    kind = "kafka"
    durable_kill = True

    def __init__(
        self,
        data_dir: str | Path,
        host: str = "127.0.0.1",
        port: int = 9092,
        *,
        version: str = KAFKA_VERSION,
        transaction_max_timeout_ms: int = 900_000,
        extra: dict[str, str] | None = None,
        node_id: int = 1,
        voters: dict[int, int] | None = None,
        cluster_id: str | None = None,
        advertised_port: int | None = None,
        internal_port: int | None = None,
    ) -> None:
        super().__init__(data_dir, host, port)
        self.advertised_port = advertised_port
        self.internal_port = internal_port
        if advertised_port is not None and internal_port is None:
            self.internal_port = free_port(host)
        self.version = version
        self.transaction_max_timeout_ms = transaction_max_timeout_ms
        self.extra = dict(extra or {})
        self.node_id = node_id
        self.voters = dict(voters or {})
        self.cluster_id = cluster_id

    @property
    def internal_bootstrap(self) -> str:
        """host:port of the listener that clients reach without `advertised_port`'s detour (the
        plain bootstrap when there is none)."""
        if self.internal_port is None:
            return self.bootstrap
        return f"{self.host}:{self.internal_port}"

    @property
    def config_file(self) -> Path:
        return self.data_dir / "server.properties"

    @property
    def log_dir(self) -> Path:
        return self.data_dir / "kafka-logs"

    def _controller_port(self) -> int:
        if self.voters:
            return self.voters[self.node_id]
        # Kept in the config file: a restart must find the quorum where it was formatted.
        if self.config_file.is_file():
            for line in self.config_file.read_text(encoding="utf-8").splitlines():
                if line.startswith("controller.quorum.voters="):
                    return int(line.rsplit(":", 1)[1])
        return free_port(self.host)

    def server_properties(self, controller_port: int) -> dict[str, str]:
        """The broker's configuration."""
        h = self.host
        voters = self.voters or {self.node_id: controller_port}
        props = {
            "process.roles": "broker,controller",
            "node.id": str(self.node_id),
            "controller.quorum.voters": ",".join(f"{n}@{h}:{p}" for n, p in sorted(voters.items())),
            "listeners": f"PLAINTEXT://{h}:{self.port},CONTROLLER://{h}:{controller_port}",
            "advertised.listeners": f"PLAINTEXT://{h}:{self.port}",
            "controller.listener.names": "CONTROLLER",
            "inter.broker.listener.name": "PLAINTEXT",
            "listener.security.protocol.map": "PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT",
            "log.dirs": str(self.log_dir),
            "num.partitions": "1",
            "auto.create.topics.enable": "false",
            "offsets.topic.num.partitions": "3",
            "transaction.state.log.num.partitions": "3",
            **replication_props(len(voters)),
            "group.initial.rebalance.delay.ms": "0",
            "transaction.max.timeout.ms": str(self.transaction_max_timeout_ms),
            # A restarted single node is back in seconds, not after the default 9 s session.
            "broker.session.timeout.ms": "4000",
            "broker.heartbeat.interval.ms": "500",
        }
        if self.advertised_port is not None:
            props.update(self._detour_listeners(controller_port))
        props.update(self.extra)
        return props

    def _detour_listeners(self, controller_port: int) -> dict[str, str]:
        """Clients are sent to `advertised_port`; the broker talks to itself on INTERNAL."""
        h = self.host
        return {
            "listeners": f"PLAINTEXT://{h}:{self.port},INTERNAL://{h}:{self.internal_port},"
            f"CONTROLLER://{h}:{controller_port}",
            "advertised.listeners": f"PLAINTEXT://{h}:{self.advertised_port},"
            f"INTERNAL://{h}:{self.internal_port}",
            "inter.broker.listener.name": "INTERNAL",
            "listener.security.protocol.map": (
                "PLAINTEXT:PLAINTEXT,INTERNAL:PLAINTEXT,CONTROLLER:PLAINTEXT"
            ),
        }

    def prepare(self) -> None:
        port = self._controller_port()
        text = "".join(f"{k}={v}\n" for k, v in self.server_properties(port).items())
        self.config_file.write_text(text, encoding="utf-8")
        (self.data_dir / "log4j2.properties").write_text(_LOG4J2, encoding="utf-8")
        if (self.log_dir / "meta.properties").is_file():
            return
        cluster_id = self.cluster_id or new_cluster_id()
        cmd = [*self._java(), "kafka.tools.StorageTool", "format", "-t", cluster_id]
        cmd += ["-c", str(self.config_file)]
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=120, check=False)
        if done.returncode != 0:
            raise BrokerError(
                f"formatting Kafka storage in {self.log_dir} failed (exit {done.returncode}):\n"
                + (done.stdout + done.stderr)[-2000:]
            )
        logger.info("formatted KRaft storage in %s (cluster %s)", self.log_dir, cluster_id)

    def _java(self) -> list[str]:
        log4j = self.data_dir / "log4j2.properties"
        return [
            java_executable(),
            *_JVM_OPTS,
            f"-Dlog4j2.configurationFile={log4j}",
            "-Djava.awt.headless=true",
            "-cp",
            kafka_classpath(self.version),
        ]

    def command(self) -> list[str]:
        return [*self._java(), "kafka.Kafka", str(self.config_file)]
