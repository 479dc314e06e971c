"""The world a chaos run acts on (in the `ipcount chaos` process): the broker, fresh topics, the
settings its child processes get, and the `loadgen synth` runs that keep data flowing."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

from ipcount.chaos.plan import BROKER_EVENTS, ChaosOptions
from ipcount.chaos.processes import SynthProcess, child_env
from ipcount.config import Settings, load_settings
from ipcount.errors import IpcountError
from ipcount.kafka.topics import ensure_topics
from ipcount.local.broker import LocalBroker, free_port
from ipcount.local.kinds import configured_broker
from ipcount.local.kraft_cluster import KafkaCluster

__all__ = ["ChaosError", "ChaosEnv"]


class ChaosError(IpcountError):
    """The chaos run could not carry on (a job that never starts, a generator that fails)."""


class ChaosEnv:
    """Broker, topics, settings and generators of one run (see `open()` and `close()`)."""

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
        self.broker: LocalBroker | None = None
        # The local cluster of a run with --broker-nodes 3 (then `broker` is None).
        self.cluster: KafkaCluster | None = None
        self.own_broker = False
        self.synths: list[SynthProcess] = []
        self.synth_paused = False
        self.cli: list[str] = []

    def overrides(self, bootstrap: str) -> list[str]:
        """The settings every child process gets (as --set): fresh topics, own checkpoint."""
        o, t = self.options, self.tag
        return [
            f"kafka.bootstrap_servers={bootstrap}",
            f"topics.source=chaos-{t}-source",
            f"topics.sink=chaos-{t}-sink",
            f"topics.progress=chaos-{t}-progress",
            f"topics.late=chaos-{t}-late",
            f"topics.dead_letter=chaos-{t}-dead-letter",
            f"job.checkpoint_location={self.run_dir / 'checkpoint'}",
            f"job.idle_timeout_seconds={o.idle_timeout_seconds:g}",
            f"job.trigger_interval_seconds={o.trigger_interval_seconds:g}",
            # Small Spark for a 2-core machine: two task threads, two state stores per batch.
            "spark.master=local[2]",
            "spark.shuffle_partitions=2",
        ]

    def open(self, events: list[str]) -> list[str]:
        """Start (or find) the broker and create the topics; returns the events this broker
        allows (no restarts of a broker that is not ours to restart)."""
        self.run_dir.mkdir(parents=True, exist_ok=True)
        if self.options.use_configured_broker:
            bootstrap = self.base.kafka.bootstrap_servers
            local = configured_broker(self.base)
            # Only the local [broker] (`ipcount broker start`) can be restarted from here.
            if local.status().running and local.bootstrap == bootstrap:
                self.broker = local
            elif any(e in BROKER_EVENTS for e in events):
                self.on_note(f"{bootstrap} is not the local [broker]: broker faults skipped")
                events = [e for e in events if e not in BROKER_EVENTS]
        elif self.options.cluster:
            bootstrap = self._start_cluster()
            events = [e for e in events if e not in BROKER_EVENTS]
        else:
            self.broker = configured_broker(self.base, self.run_dir / "broker", free_port())
            self.broker.start(timeout=self.base.broker.start_timeout_seconds)
            self.own_broker = True
            bootstrap = self.broker.bootstrap
        sets = self.overrides(bootstrap)
        path = None if self.base.source_path == "defaults" else self.base.source_path
        self.cli = [*(["--config", path] if path else []), *(a for s in sets for a in ("--set", s))]
        self.settings = load_settings(path, overrides=sets, use_default_path=False)
        ensure_topics(self.settings)
        self.checkpoint = Path(self.settings.job.checkpoint_location)
        self.on_note(
            f"seed {self.seed}; broker {bootstrap}; topics chaos-{self.tag}-*; "
            f"run dir {self.run_dir}"
        )
        return events

    def _start_cluster(self) -> str:
        """Start the run's local Apache Kafka cluster; its bootstrap list.

        Raises:
            ChaosError: broker.kind is not Apache Kafka.
        """
        if self.base.broker.kind != "kafka":
            raise ChaosError(
                f"--broker-nodes {self.options.broker_nodes} starts a local Apache Kafka cluster; "
                f'broker.kind is {self.base.broker.kind!r}: set broker.kind = "kafka" (env '
                "IPCOUNT_BROKER_KIND=kafka)"
            )
        self.cluster = KafkaCluster(self.run_dir / "cluster", self.options.broker_nodes)
        # Three nodes start in about the time of one, but wait for each other's quorum.
        self.cluster.start(timeout=2 * self.base.broker.start_timeout_seconds)
        self.own_broker = True
        return self.cluster.bootstrap

    # --- generators -----------------------------------------------------------------------

    def start_synth(self, count: int) -> None:
        o, k = self.options, len(self.synths) + 1
        self.synths.append(
            SynthProcess(
                self.cli,
                count=count,
                rate=self.rate,
                seed=self.seed + k - 1,
                ips=o.ips,
                late_fraction=o.late_fraction,
                malformed_fraction=o.malformed_fraction,
                ledger=self.run_dir / f"ledger-{k}.jsonl",
                log_path=self.run_dir / f"synth-{k}.log",
                env=child_env(),
            )
        )
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
        """Stop the generators and, if this run started it, the broker."""
        for synth in self.synths:
            synth.stop()
        if self.broker is not None and self.own_broker:
            self.broker.stop()
        if self.cluster is not None:
            for node in self.cluster.members():
                node.resume()  # a node left hung by an interrupted fault would not stop
            self.cluster.stop()
