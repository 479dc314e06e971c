"""The faults of a local Apache Kafka cluster in a chaos run (`ipcount chaos --broker-nodes 3`): a
SIGKILL of the sink's partition leader, of the job's transaction coordinator or of the active
controller, a hung leader, a rolling restart and two nodes down at once, each at a chosen moment
(a part of ipcount.chaos.runner's ChaosRunner, in the `ipcount chaos` process).

Each fault runs in a thread while this one watches the job: the first batch Spark commits after
the fault started is its recovery time, and the job's log says whether a query was restarted
inside the job (a fault the job did not ride through) or the job died and was restarted."""

from __future__ import annotations

import json
import logging
import os
import re
import signal
import time
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING

from confluent_kafka.admin import AdminClient

from ipcount.chaos.check import query_id
from ipcount.chaos.env import ChaosError
from ipcount.chaos.plan import (
    CONTROLLER_KILL,
    COORDINATOR_KILL,
    IN_COMMIT,
    LEADER_HANG,
    LEADER_KILL,
    RANDOM,
    ROLLING_RESTART,
    TWO_DOWN,
    split_cluster_event,
)
from ipcount.chaos.processes import last_committed_batch, last_planned_batch
from ipcount.chaos.runner_parts import RunnerParts
from ipcount.local_pipeline.children import JobProcess

if TYPE_CHECKING:
    from pathlib import Path

    from ipcount.local.kraft import KafkaBroker
    from ipcount.local.kraft_cluster import KafkaCluster

__all__ = [
    "ClusterFaults",
    "active_controller",
    "coordinator_node",
    "coordinator_partition",
    "counting_transactional_id",
    "java_string_hash",
    "QUERY_RESTART_LINE",
]

logger = logging.getLogger(__name__)

# What the job's log says when its runner restarts a failed query (ipcount.job.supervisor).
QUERY_RESTART_LINE = "restarting the query"
_TXN_READY = re.compile(r"transactional\.id (?P<tid>\S+) (?:ready|initialised)")
TRANSACTION_TOPIC = "__transaction_state"


def java_string_hash(text: str) -> int:
    """Java's String.hashCode of `text` (over UTF-16 code units, 32-bit overflow)."""
    h = 0
    data = text.encode("utf-16-be")
    for i in range(0, len(data), 2):
        h = (31 * h + int.from_bytes(data[i : i + 2], "big")) & 0xFFFFFFFF
    return h - (1 << 32) if h >= 1 << 31 else h


def coordinator_partition(transactional_id: str, partitions: int) -> int:
    """The partition of __transaction_state whose leader coordinates `transactional_id`
    (Kafka's TransactionStateManager.partitionFor: Utils.abs(hashCode) % partitions)."""
    h = java_string_hash(transactional_id)
    return (0 if h == -(1 << 31) else abs(h)) % partitions


def active_controller(nodes: list[KafkaBroker]) -> int | None:
    """The node id of the active KRaft controller: the leader of the newest epoch in the
    quorum-state files of the nodes (each node keeps its view of the metadata quorum there)."""
    best: tuple[int, int] | None = None
    for node in nodes:
        path = node.log_dir / "__cluster_metadata-0" / "quorum-state"
        try:
            state = json.loads(path.read_text(encoding="utf-8"))
            leader, epoch = int(state["leaderId"]), int(state["leaderEpoch"])
        except (OSError, ValueError, KeyError, TypeError):
            continue
        if leader >= 0 and (best is None or epoch > best[0]):
            best = (epoch, leader)
    return None if best is None else best[1]


class ClusterFaults(RunnerParts):
    """Cluster faults while the job runs; mixed into ChaosRunner, which provides the waiting, the
    events and the job starts (and, through BrokerFaults, the frozen writer)."""

    if TYPE_CHECKING:

        def _freeze_writer(
            self, job: JobProcess, event: str
        ) -> tuple[JobProcess, tuple[int, int] | None]: ...

    def _cluster_fault(self, job: JobProcess, event: str) -> JobProcess | None:
        """Strike the cluster fault `event` ("<kind>@<moment>"); the job if it carried on, else
        None (it died or made no progress: the runner starts the next one)."""
        split = split_cluster_event(event)
        if split is None:
            raise ValueError(f"not a cluster fault: {event!r}")
        kind, moment = split
        if moment == RANDOM:
            job = self._ready_then_wait(job, event, self.rng.uniform(0.5, 3.0))
            return self._strike(job, event, kind, None, None, "")
        job, frozen = self._freeze_writer(job, event)
        if frozen is None:
            return None
        batch, pid = frozen
        when = (
            f"batch {batch}'s commit in flight"
            if moment == IN_COMMIT
            else f"batch {batch} committed to Kafka, not yet to Spark's commit log"
        )
        # In a commit: the request leaves as the fault starts. After it: the fault starts, then
        # the writer goes on to Spark's commit log.
        resume_after = 0.0 if moment == IN_COMMIT else 0.5
        return self._strike(job, event, kind, batch, (pid, resume_after), f"{when}; ")

    def _strike(
        self,
        job: JobProcess,
        event: str,
        kind: str,
        batch: int | None,
        resume: tuple[int, float] | None,
        context: str,
    ) -> JobProcess | None:
        restarts_before = job.log_text().count(QUERY_RESTART_LINE)
        before = last_committed_batch(self.checkpoint)
        # Recovered once a batch planned after the fault began is committed: the batch a frozen
        # writer was committing (or had committed to Kafka) does not count.
        planned = last_planned_batch(self.checkpoint)
        t0 = time.monotonic()
        first: float | None = None  # seconds to that commit
        with ThreadPoolExecutor(1, thread_name_prefix="ipcount-chaos-cluster") as pool:
            action = pool.submit(self._cluster_action, kind, job)
            if resume is not None:
                time.sleep(resume[1])
                _resume(resume[0])
            done_at: float | None = None
            after_done: int | None = None
            deadline = None
            while True:
                last = last_committed_batch(self.checkpoint)
                if first is None and last is not None and (planned is None or last > planned):
                    first = time.monotonic() - t0
                if action.done():
                    if done_at is None:
                        done_at, after_done = time.monotonic(), last
                        deadline = done_at + self.options.start_timeout_seconds
                    settled = last is not None and (after_done is None or last > after_done)
                    if settled or not job.alive or time.monotonic() > (deadline or 0):
                        break
                self._tick()
            what = action.result()
        restarts = job.log_text().count(QUERY_RESTART_LINE) - restarts_before
        outcome = f"{context}{what}; "
        survivor: JobProcess | None = job
        if not job.alive:
            job.reap()
            outcome += f"job died (exit {job.returncode}, see {job.log_path.name}): restarted"
            survivor = None
        elif done_at is not None and last_committed_batch(self.checkpoint) == after_done:
            job.kill()
            outcome += "job made no progress after it: SIGKILLed and restarted"
            survivor = None
        elif restarts:
            outcome += f"the job restarted its query {restarts}x and carried on"
        else:
            outcome += "the job rode through it (no query restart)"
        if first is not None:
            outcome += f"; a new batch committed {first:.1f}s after the fault began"
        self._event(
            event,
            batch if batch is not None else before,
            outcome,
            recovery_s=None if first is None else round(first, 1),
            query_restarts=restarts,
            job_died=survivor is None,
            began=(t0, planned),
        )
        return survivor

    # --- the faults (run in a thread) ------------------------------------------------------

    def _cluster_action(self, kind: str, job: JobProcess) -> str:
        cluster = self._cluster()
        if kind == LEADER_KILL:
            node = self._sink_leader(cluster)
            return self._kill_and_restart([node], f"the sink's leader (node {node})")
        if kind == COORDINATOR_KILL:
            tid, node = self._coordinator(cluster, job)
            return self._kill_and_restart([node], f"the coordinator of {tid} (node {node})")
        if kind == CONTROLLER_KILL:
            node = active_controller(cluster.members()) or 1
            return self._kill_and_restart([node], f"the active controller (node {node})")
        if kind == LEADER_HANG:
            node = self._sink_leader(cluster)
            cluster.node(node).pause()
            time.sleep(self.options.broker_hang_seconds)
            cluster.node(node).resume()
            return (
                f"SIGSTOP of the sink's leader (node {node}) for "
                f"{self.options.broker_hang_seconds:g}s, then SIGCONT"
            )
        if kind == ROLLING_RESTART:
            t = time.monotonic()
            for member in cluster.members():
                member.stop()
                self._start_nodes(cluster, [member.node_id])
            return f"rolling restart (SIGTERM, start, in sync) of all nodes in {_since(t)}"
        if kind == TWO_DOWN:
            leader = self._sink_leader(cluster)
            other = next(m.node_id for m in cluster.members() if m.node_id != leader)
            return self._kill_and_restart(
                [leader, other], f"two nodes at once ({leader}, the sink's leader, and {other})"
            )
        raise AssertionError(kind)

    def _cluster(self) -> KafkaCluster:
        cluster = self.env.cluster
        if cluster is None:
            raise ChaosError("cluster faults need a local cluster (--broker-nodes 3)")
        return cluster

    def _kill_and_restart(self, nodes: list[int], what: str) -> str:
        cluster = self._cluster()
        t = time.monotonic()
        for n in nodes:
            cluster.node(n).kill()
        time.sleep(self.options.node_downtime_seconds)
        self._start_nodes(cluster, nodes)
        return f"SIGKILL of {what}, back and in sync after {_since(t)}"

    def _start_nodes(self, cluster: KafkaCluster, nodes: list[int]) -> None:
        """Start `nodes` together (two nodes of three need each other for a quorum) and wait
        until every partition of the run has all its replicas in sync again."""
        # A node shares the cores with the job and the other nodes: one start under load was
        # seen to stall 27 s, past broker.start_timeout_seconds' default 30 s.
        timeout = 3 * self.env.base.broker.start_timeout_seconds
        with ThreadPoolExecutor(len(nodes), thread_name_prefix="ipcount-chaos-node") as pool:
            list(pool.map(lambda n: cluster.node(n).start(timeout=timeout), nodes))
        cluster.wait_whole(timeout)
        cluster.wait_in_sync(timeout + 60)

    def _sink_leader(self, cluster: KafkaCluster) -> int:
        topic = self.env.settings.topics.sink
        md = AdminClient({"bootstrap.servers": cluster.bootstrap}).list_topics(topic, timeout=10)
        return int(md.topics[topic].partitions[0].leader)

    def _coordinator(self, cluster: KafkaCluster, job: JobProcess) -> tuple[str, int]:
        """The counting query's transactional.id and the node that coordinates it."""
        log = job.log_text()
        tid = counting_transactional_id(log, self.checkpoint)
        if tid is None:
            # Not logged yet: the first one the job logged, else the default of the query id.
            tids = [m.group("tid") for m in _TXN_READY.finditer(log)]
            tid = tids[0] if tids else f"ipcount-{query_id(self.checkpoint) or ''}"
        return tid, coordinator_node(cluster.bootstrap, tid)


def counting_transactional_id(log: str, checkpoint: str | Path) -> str | None:
    """The counting query's transactional.id in a job's log: the one naming the checkpoint's
    query id (None if none does)."""
    query = query_id(checkpoint)
    tids = (m.group("tid") for m in _TXN_READY.finditer(log))
    return next((t for t in tids if query and query in t), None)


def coordinator_node(bootstrap: str, transactional_id: str) -> int:
    """The node id of the transaction coordinator of `transactional_id` (the leader of its
    __transaction_state partition)."""
    admin = AdminClient({"bootstrap.servers": bootstrap})
    md = admin.list_topics(TRANSACTION_TOPIC, timeout=10).topics[TRANSACTION_TOPIC]
    return int(md.partitions[coordinator_partition(transactional_id, len(md.partitions))].leader)


def _resume(pid: int) -> None:
    try:
        os.kill(pid, signal.SIGCONT)
    except ProcessLookupError:
        logger.warning("the frozen writer (pid %d) was gone", pid)


def _since(t: float) -> str:
    return f"{time.monotonic() - t:.1f}s"
