"""The world a chaos run acts on (in the `ipcount chaos` process): a local pipeline run (broker,
fresh topics, the settings its children get) and the `loadgen synth` runs that keep data flowing."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

from ipcount.chaos.plan import BROKER_EVENTS, ChaosOptions
from ipcount.config import Settings
from ipcount.errors import ConfigError, IpcountError
from ipcount.local.broker import LocalBroker
from ipcount.local.kraft_cluster import KafkaCluster
from ipcount.local_pipeline.children import SynthProcess
from ipcount.local_pipeline.steps import LocalPipeline

__all__ = ["ChaosError", "ChaosEnv"]


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
        self.pipeline.create_topics()
        self.on_note(
            f"seed {self.seed}; broker {bootstrap}; topics chaos-{self.tag}-*; "
            f"run dir {self.run_dir}"
        )
        return events

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
        """Stop the generators and, if this run started it, the broker."""
        for synth in self.synths:
            synth.stop()
        self.pipeline.close()
