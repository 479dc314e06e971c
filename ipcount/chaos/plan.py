"""What a chaos run does and what it found: options, the seeded fault plan, events, the report
(pure data, used by ipcount.chaos.runner in the `ipcount chaos` process)."""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from pathlib import Path

from ipcount.errors import ConfigError
from ipcount.verify.compare import VerifyReport

__all__ = [
    "KILL",
    "EXECUTOR_KILL",
    "BEFORE_COMMIT",
    "AFTER_COMMIT",
    "BROKER_RESTART",
    "BROKER_COMMIT",
    "BROKER_EVENTS",
    "JOB_EXIT",
    "INJECTED",
    "CLUSTER_KINDS",
    "CLUSTER_MOMENTS",
    "cluster_event",
    "freeze_point",
    "split_cluster_event",
    "ChaosOptions",
    "ChaosEvent",
    "ChaosReport",
    "plan_events",
]

# A SIGKILL of the job's process group at a random moment (on a standalone cluster: the driver).
KILL = "kill"
# On a standalone cluster: a SIGKILL of one worker's executor (JVM and Python workers) at a
# random moment; the worker starts a new one, Spark re-runs the lost tasks.
EXECUTOR_KILL = "executor-kill"
# ipcount.faults points: the job kills itself inside the sink's open transaction / between the
# Kafka commit and Spark's commit log.
BEFORE_COMMIT = "sink.before_commit"
AFTER_COMMIT = "sink.after_commit"
INJECTED = (BEFORE_COMMIT, AFTER_COMMIT)
# A stop and start of the broker while the job runs: SIGTERM (controlled shutdown), or SIGKILL
# when the broker loses nothing it acknowledged on a kill (Apache Kafka; see LocalBroker).
BROKER_RESTART = "broker-restart"
# A broker restart while the sink's commit is in flight: the writer stops itself right before
# commit_transaction (a sink.before_commit "/stop" fault), is resumed, and the broker is stopped
# at once, so the commit request races the shutdown (the moment noida-db was seen to acknowledge
# a commit and lose it). Every second broker restart of a plan is one of these.
BROKER_COMMIT = "broker-restart-commit"
# A hung broker: SIGSTOP, then SIGCONT (connections stay open, nothing is answered).
BROKER_HANG = "broker-hang"
BROKER_EVENTS = (BROKER_RESTART, BROKER_COMMIT, BROKER_HANG)
# Faults of a local cluster (`--broker-nodes 3`), each at a moment (see CLUSTER_MOMENTS); an event
# is "<kind>@<moment>", e.g. "coordinator-kill@in-commit".
LEADER_KILL = "leader-kill"  # SIGKILL of the leader of the sink's partition 0, then a restart
COORDINATOR_KILL = "coordinator-kill"  # SIGKILL of the job's transaction coordinator
CONTROLLER_KILL = "controller-kill"  # SIGKILL of the active KRaft controller
LEADER_HANG = "leader-hang"  # SIGSTOP of the sink's leader for longer than the session timeout
ROLLING_RESTART = "rolling-restart"  # every node in turn: SIGTERM, start, in sync again
TWO_DOWN = "two-down"  # SIGKILL of two nodes: below min ISR and the controller quorum
CLUSTER_KINDS = (
    LEADER_KILL,
    COORDINATOR_KILL,
    CONTROLLER_KILL,
    LEADER_HANG,
    ROLLING_RESTART,
    TWO_DOWN,
)
# When a cluster fault strikes: at a random moment while the job runs; while a commit request is
# in flight (the writer froze right before commit_transaction and is resumed as the fault
# starts); between the Kafka commit and Spark's commit log (the writer froze right after the
# commit; the fault starts, then it is resumed).
RANDOM, IN_COMMIT, AFTER_KAFKA_COMMIT = "random", "in-commit", "after-commit"
CLUSTER_MOMENTS = (RANDOM, IN_COMMIT, AFTER_KAFKA_COMMIT)
# The job ended on its own (not planned): it is restarted and reported.
JOB_EXIT = "job-exit"
# The job's self-check found a commit the broker acknowledged and lost: the round ends, reported.
BROKER_LOSS = "broker-loss-detected"


@dataclass(frozen=True)
class ChaosOptions:
    """Figures of one chaos run (see `ipcount chaos --help`)."""

    work_dir: Path
    records: int = 20_000
    # Records per second; None spreads `records` over the time the planned faults need.
    rate: float | None = None
    # SIGKILLs of the job (at random moments and at the sink's fault points), restarts of the
    # broker, and hangs of it (SIGSTOP, then SIGCONT after broker_hang_seconds).
    kills: int = 3
    broker_restarts: int = 1
    broker_hangs: int = 0
    # Nodes of the local Apache Kafka cluster the run starts (1: one broker); from 3 on, the run
    # adds `cluster_faults` faults of CLUSTER_KINDS in place of single-broker restarts and hangs.
    broker_nodes: int = 1
    cluster_faults: int = 6
    # Seconds a killed node stays down (leader, coordinator and controller kills, two down).
    node_downtime_seconds: float = 10.0
    # Seconds a hung broker stays stopped.
    broker_hang_seconds: float = 8.0
    seed: int | None = None
    ips: int = 200
    late_fraction: float = 0.002
    malformed_fraction: float = 0.002
    use_configured_broker: bool = False
    # Workers of a local Spark standalone cluster the job runs on (0: Spark's local mode). Then
    # the fault points kill the executor that runs the sink task, and executors are killed too.
    standalone_workers: int = 0
    # Small, so the last windows close soon after the traffic. Heartbeats close windows after
    # this much idle time, which would make records late that wait in a producer for longer (e.g.
    # while the broker is away): the generator is therefore stopped across broker restarts.
    idle_timeout_seconds: float = 3.0
    trigger_interval_seconds: float = 1.0
    broker_downtime_seconds: float = 1.0
    # How long a (re)started job may take to commit its first batch on a loaded machine.
    start_timeout_seconds: float = 240.0
    # Batches after the last committed one over which an injected fault may fire.
    fault_span: int = 60
    # Rough cost of one fault (job restart + first batch) here, for the default rate.
    seconds_per_fault: float = 40.0

    def validate(self) -> None:
        """Raises ConfigError naming the option to fix."""
        if self.records < 100:
            raise ConfigError("--records must be at least 100")
        if self.rate is not None and self.rate <= 0:
            raise ConfigError("--rate must be positive")
        if self.kills < 0 or self.broker_restarts < 0 or self.broker_hangs < 0:
            raise ConfigError(
                "--kills, --broker-restarts and --broker-hangs must be zero or positive"
            )
        if self.ips < 1:
            raise ConfigError("--ips must be at least 1")
        if self.idle_timeout_seconds <= 0 or self.trigger_interval_seconds < 0:
            raise ConfigError("--idle-timeout must be positive, --trigger-interval not negative")
        if self.fault_span < 1:
            raise ConfigError("--fault-span must be at least 1")
        if self.broker_nodes not in (1, 3, 4, 5):
            raise ConfigError(
                "--broker-nodes is 1 (one broker) or 3 to 5 (a local Apache Kafka cluster with "
                "three replicas and two in sync: the cluster faults need a quorum of three)"
            )
        if self.broker_nodes > 1 and self.use_configured_broker:
            raise ConfigError(
                "--broker-nodes starts a local cluster; it cannot be combined with "
                "--use-configured-broker"
            )
        if self.cluster_faults < 0 or self.node_downtime_seconds < 0:
            raise ConfigError("--cluster-faults and --node-downtime must be zero or positive")
        if self.standalone_workers < 0:
            raise ConfigError("--standalone-workers must be 0 (Spark's local mode) or positive")
        if self.standalone_workers and (self.broker_nodes > 1 or self.broker_restarts > 1):
            # Those faults freeze the writer in the job's own process ("/stop" in IPCOUNT_FAULTS).
            raise ConfigError(
                "--standalone-workers takes --broker-restarts 0 or 1 and one broker node: the "
                "commit-time broker faults (a second restart, --broker-nodes 3) need Spark's "
                "local mode"
            )

    @property
    def cluster(self) -> bool:
        """Whether the run starts a local cluster (and plans cluster faults)."""
        return self.broker_nodes > 1

    def effective_rate(self, events: int) -> float:
        """--rate, or records spread over the planned faults plus some traffic after the last."""
        if self.rate is not None:
            return self.rate
        seconds = self.seconds_per_fault * (events + 1)
        return max(10.0, self.records / seconds)


def cluster_event(kind: str, moment: str) -> str:
    return f"{kind}@{moment}"


def split_cluster_event(event: str) -> tuple[str, str] | None:
    """(kind, moment) of a cluster event; None for any other event."""
    kind, _, moment = event.partition("@")
    return (kind, moment) if kind in CLUSTER_KINDS and moment in CLUSTER_MOMENTS else None


def freeze_point(event: str | None) -> str | None:
    """The fault point where a job started for `event` freezes its writer ("/stop"), if any: before
    the commit for a broker restart in a commit and a cluster fault in one, after it for a cluster
    fault between the Kafka commit and Spark's commit log."""
    if event == BROKER_COMMIT:
        return BEFORE_COMMIT
    split = split_cluster_event(event or "")
    if split is None or split[1] not in (IN_COMMIT, AFTER_KAFKA_COMMIT):
        return None
    return BEFORE_COMMIT if split[1] == IN_COMMIT else AFTER_COMMIT


def plan_cluster_faults(count: int, rng: random.Random) -> list[str]:
    """`count` cluster events: every kind once before any repeats (a shuffled round at a time),
    their moments going round CLUSTER_MOMENTS from a random start, so six faults hold each kind
    once and each moment twice."""
    if count <= 0:
        return []  # draws nothing: the plans of runs without a cluster stay as they were
    kinds: list[str] = []
    while len(kinds) < count:
        round_ = list(CLUSTER_KINDS)
        rng.shuffle(round_)
        kinds += round_
    first = rng.randrange(len(CLUSTER_MOMENTS))
    return [
        cluster_event(k, CLUSTER_MOMENTS[(first + i) % len(CLUSTER_MOMENTS)])
        for i, k in enumerate(kinds[:count])
    ]


def plan_events(
    kills: int,
    broker_restarts: int,
    rng: random.Random,
    broker_hangs: int = 0,
    cluster_faults: int = 0,
    executors: bool = False,
) -> list[str]:
    """The order of faults: `kills` job kills (at least one random SIGKILL, one
    sink.before_commit and one sink.after_commit when kills >= 3; otherwise before_commit first,
    then after_commit), `broker_restarts` broker restarts (every second one while a commit is in
    flight: BROKER_COMMIT), `broker_hangs` broker hangs and `cluster_faults` cluster faults
    (see plan_cluster_faults). With `executors` (a standalone cluster), EXECUTOR_KILL is a
    fourth kind of kill (one of each kind when kills >= 4).

    An injected fault is armed when the job starts (IPCOUNT_FAULTS is read by the job), so a
    broker restart the job may survive is placed only before a random kill or at the end: the
    job that runs after it never needs to carry a fault it was not started with.
    """
    base = [BEFORE_COMMIT, AFTER_COMMIT, KILL] + ([EXECUTOR_KILL] if executors else [])
    first = min(kills, len(base))
    kinds = base[:first] + [rng.choice(base) for _ in range(kills - first)]
    rng.shuffle(kinds)
    restarts = [BROKER_COMMIT if i % 2 else BROKER_RESTART for i in range(broker_restarts)]
    broker = restarts + [BROKER_HANG] * broker_hangs + plan_cluster_faults(cluster_faults, rng)
    for event in broker:
        slots = [i for i, k in enumerate(kinds) if k == KILL] + [len(kinds)]
        kinds.insert(rng.choice(slots), event)
    return kinds


@dataclass
class ChaosEvent:
    """One fault as it happened: when (seconds since the run started), what, which batch."""

    at: float
    kind: str
    batch: int | None
    outcome: str
    # False when a planned fault could not be injected (e.g. the fault point never fired).
    injected: bool = True
    # The signal a broker event sent (SIGTERM, SIGKILL or SIGSTOP).
    signal: str = ""
    # Seconds from the fault to the next batch in Spark's commit log (None: not seen).
    recovery_s: float | None = None
    # The sink task a fault point struck, when it said (standalone: from the executor's line).
    partition: int | None = None
    # Cluster faults: query restarts inside the job while it lasted, and whether the job died.
    query_restarts: int = 0
    job_died: bool = False

    def line(self) -> str:
        batch = "-" if self.batch is None else str(self.batch)
        return f"{self.at:7.1f}s  {self.kind:<18} batch={batch:<5} {self.outcome}"


@dataclass
class ChaosReport:
    """Everything a chaos run observed."""

    seed: int
    run_dir: Path
    events: list[ChaosEvent] = field(default_factory=list)
    job_starts: int = 0
    records: int = 0
    synth_summary: str = ""
    committed: VerifyReport | None = None
    uncommitted: VerifyReport | None = None
    seconds: float = 0.0
    verify_command: str = ""
    # Fired fault points whose effect the progress topic confirms at the end, and those it does not.
    confirmed: list[str] = field(default_factory=list)
    unconfirmed: list[str] = field(default_factory=list)
    # What the job said when its self-check found a commit the broker acknowledged and lost.
    broker_loss: str = ""

    def count(self, kind: str, injected: bool = True) -> int:
        return sum(1 for e in self.events if e.kind == kind and e.injected == injected)

    def signals(self, name: str) -> int:
        """Broker events that sent signal `name`."""
        return sum(1 for e in self.events if e.signal == name)

    @property
    def kills(self) -> int:
        """Job crashes by SIGKILL that happened: random kills and fault points that fired."""
        return sum(self.count(k) for k in (KILL, EXECUTOR_KILL, *INJECTED))

    @property
    def cluster_faults(self) -> int:
        """Cluster faults that happened."""
        return sum(1 for e in self.events if split_cluster_event(e.kind) and e.injected)

    @property
    def missed(self) -> int:
        """Planned faults that could not be injected."""
        return sum(1 for e in self.events if not e.injected)

    @property
    def exact(self) -> bool:
        return self.committed is not None and self.committed.exact

    @property
    def ok(self) -> bool:
        """Exact output, and every planned fault was injected and did what it should."""
        return self.exact and self.missed == 0 and not self.unconfirmed and not self.broker_loss

    def final_line(self) -> str:
        """The last line: recovery figures, then the verify summary, or the detected loss."""
        if self.broker_loss:
            return f"{self.recovery_figures()} broker_loss=detected exact=false"
        if self.committed is None:
            return f"{self.recovery_figures()} exact=false"
        return f"{self.recovery_figures()} {self.committed.summary()}"

    @property
    def duplicates_prevented(self) -> int:
        """Duplicates a read_uncommitted reader sees (aborted transactions) that read_committed
        readers never see."""
        if self.uncommitted is None or self.committed is None:
            return 0
        return max(0, self.uncommitted.duplicates - self.committed.duplicates)

    def recoveries(self) -> list[float]:
        """Recovery seconds of the faults that were injected and recovered from."""
        return sorted(e.recovery_s for e in self.events if e.recovery_s is not None)

    def cluster_lines(self) -> list[str]:
        """Per cluster fault kind: how many, how many the job rode through (no query restart,
        no job restart), and recovery p50/max."""
        lines = []
        for kind in CLUSTER_KINDS:
            got = [e for e in self.events if e.kind.partition("@")[0] == kind and e.injected]
            if not got:
                continue
            rode = sum(1 for e in got if not e.query_restarts and not e.job_died)
            queries = sum(1 for e in got if e.query_restarts and not e.job_died)
            died = sum(1 for e in got if e.job_died)
            times = [e.recovery_s for e in got if e.recovery_s is not None]
            lines.append(
                f"{kind:<17} n={len(got)} rode_through={rode} query_restarted={queries} "
                f"job_restarted={died} {_figures(times)}"
            )
        return lines

    def recovery_figures(self) -> str:
        """'recovery_s_p50=X recovery_s_max=Y' (median and maximum; '-' without faults)."""
        return _figures(self.recoveries())

    def summary(self) -> str:
        results = self.committed.results if self.committed is not None else 0
        return (
            f"chaos: kills_survived={self.kills} (random={self.count(KILL)} "
            f"before_commit={self.count(BEFORE_COMMIT)} after_commit={self.count(AFTER_COMMIT)} "
            f"executor={self.count(EXECUTOR_KILL)}) "
            f"broker_restarts={self.count(BROKER_RESTART) + self.count(BROKER_COMMIT)} "
            f"cluster_faults={self.cluster_faults} "
            f"(in_commit={self.count(BROKER_COMMIT)} sigterm={self.signals('SIGTERM')} "
            f"sigkill={self.signals('SIGKILL')}) broker_hangs={self.count(BROKER_HANG)} "
            f"unplanned_exits={self.count(JOB_EXIT)} "
            f"missed_faults={self.missed} confirmed_faults={len(self.confirmed)} "
            f"unconfirmed_faults={len(self.unconfirmed)} job_starts={self.job_starts} "
            f"records={self.records} "
            f"results={results} duplicates_prevented={self.duplicates_prevented} "
            f"seconds={self.seconds:.0f} seed={self.seed} {self.recovery_figures()}"
        )


def _figures(seconds: list[float]) -> str:
    """'recovery_s_p50=X recovery_s_max=Y' (median and maximum; '-' without any)."""
    got = sorted(seconds)
    if not got:
        return "recovery_s_p50=- recovery_s_max=-"
    mid = len(got) // 2
    p50 = got[mid] if len(got) % 2 else (got[mid - 1] + got[mid]) / 2
    return f"recovery_s_p50={p50:.1f} recovery_s_max={got[-1]:.1f}"
