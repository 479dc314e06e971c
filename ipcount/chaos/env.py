"""The world a chaos run acts on (in the `ipcount chaos` process): a local pipeline run (broker,
fresh topics, the settings its children get) and the `loadgen synth` runs that keep data flowing."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

from ipcount.chaos.plan import BROKER_EVENTS, ChaosOptions
from ipcount.config import Settings
from ipcount.errors import ConfigError, IpcountError
from ipcount.faults import EXECUTOR, FILE_ENV_VAR, LOG_ENV_VAR, STATE_ENV_VAR, TARGET_ENV_VAR
from ipcount.local.broker import LocalBroker
from ipcount.local.cluster import StandaloneCluster
from ipcount.local.kraft_cluster import KafkaCluster
from ipcount.local_pipeline.children import SynthProcess
from ipcount.local_pipeline.steps import LocalPipeline

__all__ = ["ChaosError", "ChaosEnv", "STANDALONE_SPARK_CONF"]

# The Spark settings of a job on the run's standalone cluster (`--standalone-workers`): one core
# and a small heap per executor, every worker's core for the job. A task lost with its executor
# counts as one of its spark.task.maxFailures attempts (Spark's default 4): 8 lets a batch survive
# an executor killed by a fault point and random executor kills in the same batch.
STANDALONE_SPARK_CONF = {
    "spark.executor.memory": "512m",
    "spark.executor.cores": "1",
    "spark.task.maxFailures": "8",
}


class ChaosError(IpcountError):
    """The chaos run could not carry on (a job that never starts, a generator that fails)."""


class ChaosEnv:
    """A local pipeline run (`pipeline`) and what chaos adds to it: the broker faults this broker
    allows, generators kept running while records are owed, broker restarts (see `open()` and
    `close()`)."""

    def __init__(
        self,
        base: Settings,
        options: ChaosOptions,
        *,
        seed: int,
        rate: float,
        run_dir: Path,
        tag: str,
        on_note: Callable[[str], None],
    ) -> None:
        self.base, self.options, self.seed, self.rate = base, options, seed, rate
        self.run_dir, self.tag, self.on_note = run_dir, tag, on_note
        o = options
        self.pipeline = LocalPipeline(
            base,
            run_dir,
            f"chaos-{tag}",
            sets=[
                f"job.idle_timeout_seconds={o.idle_timeout_seconds:g}",
                f"job.trigger_interval_seconds={o.trigger_interval_seconds:g}",
                # Small Spark for a 2-core machine: two task threads, two state stores per batch.
                "spark.master=local[2]",
                "spark.shuffle_partitions=2",
            ],
        )
        self.checkpoint = self.pipeline.checkpoint
        self.synths: list[SynthProcess] = []
        self.synth_paused = False
        self.spark: StandaloneCluster | None = None
        # On the standalone cluster: the fault spec the executors read (armed while the job
        # runs) and the file where a fault point records the executor it kills.
        self.executor_faults_file: Path | None = None
        self.executor_faults_log: Path | None = None

    @property
    def broker(self) -> LocalBroker | None:
        """The broker a fault may restart (None on a cluster or a broker not ours to restart)."""
        return self.pipeline.broker

    @property
    def cluster(self) -> KafkaCluster | None:
        """The local cluster of a run with --broker-nodes 3 (then `broker` is None)."""
        return self.pipeline.cluster

    @property
    def settings(self) -> Settings:
        return self.pipeline.settings

    @property
    def cli(self) -> list[str]:
        return self.pipeline.cli

    def open(self, events: list[str]) -> list[str]:
        """Start (or find) the broker and create the topics; returns the events this broker
        allows (no restarts of a broker that is not ours to restart).

        Raises:
            ChaosError: --broker-nodes asked of a broker kind that is not Apache Kafka.
        """
        o = self.options
        try:
            bootstrap = self.pipeline.open_broker(
                configured=o.use_configured_broker, nodes=1 if not o.cluster else o.broker_nodes
            )
        except ConfigError as exc:
            raise ChaosError(str(exc)) from exc
        if self.broker is None and any(e in BROKER_EVENTS for e in events):
            if not o.cluster:
                self.on_note(f"{bootstrap} is not the local [broker]: broker faults skipped")
            events = [e for e in events if e not in BROKER_EVENTS]
        if o.standalone_workers:
            self._start_spark(o.standalone_workers)
        self.pipeline.create_topics()
        self.on_note(
            f"seed {self.seed}; broker {bootstrap}; topics chaos-{self.tag}-*; "
            f"run dir {self.run_dir}"
        )
        return events

    def _start_spark(self, workers: int) -> None:
        """Start the run's Spark standalone cluster (a master and `workers` 1-core workers; the
        checkout's conf/ gives their executors its quiet log4j2.properties); the job's settings
        then point at it."""
        from ipcount.job.session import conf_dir

        self.spark = StandaloneCluster(
            self.run_dir / "spark", workers=workers, cores=1, memory="1g", conf_dir=conf_dir()
        )
        self.spark.start(timeout=self.options.start_timeout_seconds)
        conf = {**STANDALONE_SPARK_CONF, "spark.cores.max": str(workers)}
        # The executors' fault points (ipcount.faults): they kill their own executor, once per
        # arming, with the spec read from a file the runner writes while the job runs.
        state = self.run_dir / "executor-fault-state"
        state.mkdir(parents=True, exist_ok=True)
        self.executor_faults_file = self.run_dir / "executor-faults.armed"
        self.executor_faults_log = self.run_dir / "executor-faults.log"
        for name, value in (
            (TARGET_ENV_VAR, EXECUTOR),
            (FILE_ENV_VAR, self.executor_faults_file),
            (STATE_ENV_VAR, state),
            (LOG_ENV_VAR, self.executor_faults_log),
        ):
            conf[f"spark.executorEnv.{name}"] = str(value)
        self.pipeline.sets += [f"spark.master={self.spark.master_url}"] + [
            f"spark.conf.{key}={value}" for key, value in conf.items()
        ]
        self.on_note(
            f"Spark standalone cluster {self.spark.master_url}: {workers} workers of one core "
            f"(logs in {self.spark.base_dir})"
        )

    # --- generators -----------------------------------------------------------------------

    def start_synth(self, count: int) -> None:
        o, k = self.options, len(self.synths) + 1
        synth = self.pipeline.start_synth(
            self.run_dir / f"ledger-{k}.jsonl",
            self.run_dir / f"synth-{k}.log",
            rate=self.rate,
            count=count,
            seed=self.seed + k - 1,
            ips=o.ips,
            late_fraction=o.late_fraction,
            malformed_fraction=o.malformed_fraction,
        )
        self.synths.append(synth)
        self.on_note(f"loadgen synth {k}: {count} records at {self.rate:.0f}/s from {o.ips} IPs")

    def check_synth(self, more: bool) -> None:
        """Fail on a failed generator; start the next one while records are owed, or (`more`)
        while faults remain: fault points fire only in batches with output, and a kill of an
        idle job proves little.

        Raises:
            ChaosError: a generator failed.
        """
        last = self.synths[-1] if self.synths else None
        if last is None or last.alive or self.synth_paused:
            return
        if not last.ok:
            raise ChaosError(
                f"loadgen synth failed (status {last.returncode}): "
                f"{last.summary() or last.log_path.read_text(errors='replace')[-2000:]}"
            )
        remaining = self.options.records - sum(s.delivered() for s in self.synths)
        if remaining > 0:
            self.start_synth(remaining)
        elif more:
            self.on_note("traffic ran out before the last fault: more records")
            self.start_synth(max(100, int(self.rate * self.options.seconds_per_fault)))

    def pause_synth(self) -> None:
        """Stop the generator: it flushes and writes its ledger (the next one starts later)."""
        self.synth_paused = True
        if self.synths:
            self.synths[-1].stop()

    def resume_synth(self, more: bool) -> None:
        self.synth_paused = False
        self.check_synth(more)

    @property
    def generating(self) -> bool:
        return any(s.alive for s in self.synths)

    @property
    def ledgers(self) -> list[Path]:
        return [s.ledger for s in self.synths if s.ledger.is_file()]

    # --- broker ---------------------------------------------------------------------------

    def restart_broker(self, how: str = "SIGTERM") -> float:
        """Stop the broker (`how`: SIGTERM, a controlled shutdown; SIGKILL) and start it again on
        the same port and data dir, or hang it (SIGSTOP, then SIGCONT); returns the seconds it
        was away."""
        if self.broker is None:
            return 0.0
        t = time.monotonic()
        if how == "SIGSTOP":
            self.broker.pause()
            time.sleep(self.options.broker_hang_seconds)
            self.broker.resume()
            return time.monotonic() - t
        if how == "SIGKILL":
            self.broker.kill()
        else:
            self.broker.stop()
        time.sleep(self.options.broker_downtime_seconds)
        self.broker.start(timeout=self.base.broker.start_timeout_seconds)
        return time.monotonic() - t

    def close(self) -> None:
        """Stop the generators, the Spark cluster and, if this run started it, the broker."""
        for synth in self.synths:
            synth.stop()
        if self.spark is not None:
            self.spark.stop()
        self.pipeline.close()
