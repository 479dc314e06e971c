"""One local pipeline run as named steps (driver side): open a broker (own, a local cluster, or
the configured one), create the run's topics, start the job and `loadgen synth` as children that
all get the same settings, verify the sink against the ledger, close."""

from __future__ import annotations

import logging
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from ipcount.config import Settings, load_settings
from ipcount.errors import ConfigError, IpcountError
from ipcount.kafka.topics import ensure_topics
from ipcount.local.broker import LocalBroker, free_port
from ipcount.local.kinds import configured_broker
from ipcount.local.kraft_cluster import KafkaCluster
from ipcount.local_pipeline.children import JobProcess, SynthProcess, child_env
from ipcount.verify.compare import VerifyReport, verify_sink
from ipcount.verify.ledger import Ledger

__all__ = ["LocalPipeline", "settings_cli", "topic_overrides"]

logger = logging.getLogger(__name__)

_ROLES = ("source", "sink", "progress", "late", "dead_letter")


def topic_overrides(tag: str, roles: Sequence[str] = _ROLES) -> list[str]:
    """--set items naming each of `roles`' topics after `tag` (`TAG-source`, `TAG-dead-letter`)."""
    return [f"topics.{role}={tag}-{role.replace('_', '-')}" for role in roles]


def settings_cli(config: str | None, overrides: Sequence[str]) -> list[str]:
    """`--config CONFIG --set O1 --set O2 ...`: how a child (`python -m ipcount`, `loadgen`, the
    bench's job) is given settings; no --config when `config` is None."""
    sets = [a for o in overrides for a in ("--set", o)]
    return ["--config", config, *sets] if config else sets


class LocalPipeline:
    """Broker, topics and children of one run under `work_dir`: `open_broker()`,
    `create_topics()`, `start_job()`, `start_synth()`, `verify()`, `close()`.

    Every child gets `cli`: the settings file the base settings came from, then `overrides`
    (the broker, topics named `TAG-<role>` unless `tag` is None, the checkpoint under
    `work_dir`, then the caller's `sets`, which win).
    """

    def __init__(
        self, base: Settings, work_dir: Path, tag: str | None, *, sets: Sequence[str] = ()
    ) -> None:
        self.base, self.work_dir, self.tag = base, Path(work_dir), tag
        self.sets = list(sets)
        self.checkpoint = self.work_dir / "checkpoint"
        self.bootstrap = ""
        # The broker this run can stop and start (its own, or the local [broker] it found);
        # None on a cluster or on a configured broker that is not local.
        self.broker: LocalBroker | None = None
        self.cluster: KafkaCluster | None = None
        self.own_broker = False
        self.broker_pid: int | None = None
        self._settings: Settings | None = None

    # --- broker ---------------------------------------------------------------------------

    def open_broker(
        self,
        *,
        configured: bool = False,
        nodes: int = 1,
        announce: Callable[[LocalBroker], None] | None = None,
    ) -> str:
        """Start this run's broker on a free port (a local Apache Kafka cluster of `nodes`
        nodes when more than one), or use the configured one (`configured`); its bootstrap.
        `announce` is shown this run's own one-node broker before it starts.

        Raises:
            ConfigError: a cluster asked of a broker kind that is not Apache Kafka.
        """
        self.work_dir.mkdir(parents=True, exist_ok=True)
        if configured:
            self.bootstrap = self.base.kafka.bootstrap_servers
            local = configured_broker(self.base)
            # Only the local [broker] (`ipcount broker start`) can be restarted from here.
            if local.status().running and local.bootstrap == self.bootstrap:
                self.broker = local
        elif nodes > 1:
            self.bootstrap = self._start_cluster(nodes)
        else:
            self.broker = configured_broker(self.base, self.work_dir / "broker", free_port())
            if announce is not None:
                announce(self.broker)
            self.broker_pid = self.broker.start(timeout=self.base.broker.start_timeout_seconds)
            self.own_broker = True
            self.bootstrap = self.broker.bootstrap
        return self.bootstrap

    def _start_cluster(self, nodes: int) -> str:
        if self.base.broker.kind != "kafka":
            raise ConfigError(
                f"--broker-nodes {nodes} starts a local Apache Kafka cluster; "
                f'broker.kind is {self.base.broker.kind!r}: set broker.kind = "kafka" (env '
                "IPCOUNT_BROKER_KIND=kafka)"
            )
        self.cluster = KafkaCluster(self.work_dir / "cluster", nodes)
        # Three nodes start in about the time of one, but wait for each other's quorum.
        self.cluster.start(timeout=2 * self.base.broker.start_timeout_seconds)
        self.own_broker = True
        return self.cluster.bootstrap

    # --- settings -------------------------------------------------------------------------

    @property
    def config_path(self) -> str | None:
        """The settings file the base settings came from (None: defaults only)."""
        path = self.base.source_path
        return None if path == "defaults" else path

    @property
    def overrides(self) -> list[str]:
        """The settings every child gets (as --set): broker, topics, checkpoint, the caller's."""
        topics = topic_overrides(self.tag) if self.tag is not None else []
        return [
            f"kafka.bootstrap_servers={self.bootstrap}",
            *topics,
            f"job.checkpoint_location={self.checkpoint}",
            *self.sets,
        ]

    @property
    def cli(self) -> list[str]:
        """`--config FILE --set ...`: what a child's command line starts with."""
        return settings_cli(self.config_path, self.overrides)

    def load(self) -> Settings:
        """The settings the children run with."""
        return load_settings(self.config_path, overrides=self.overrides, use_default_path=False)

    @property
    def settings(self) -> Settings:
        if self._settings is None:
            self._settings = self.load()
        return self._settings

    def create_topics(self) -> dict[str, str]:
        """Create the run's topics (if missing); each topic's state."""
        self._settings = self.load()
        return ensure_topics(self._settings)

    # --- children -------------------------------------------------------------------------

    def start_job(
        self,
        log: Path,
        *,
        args: Sequence[str] = (),
        sets: Sequence[str] = (),
        env: Mapping[str, str] | None = None,
        name: str = "job",
    ) -> JobProcess:
        """`python -m ipcount CLI [--set SETS] run ARGS` in its own process group."""
        extra = [a for s in sets for a in ("--set", s)]
        argv = [sys.executable, "-m", "ipcount", *self.cli, *extra, "run", *args]
        return JobProcess(argv, log, env=child_env() if env is None else env, name=name)

    def start_synth(self, ledger: Path, log: Path, *, rate: float, **options: Any) -> SynthProcess:
        """`loadgen CLI synth --rate RATE ... --ledger LEDGER` (SynthProcess names `options`)."""
        return SynthProcess(
            self.cli, rate=rate, ledger=ledger, log_path=log, env=child_env(), **options
        )

    def verify(
        self, ledger: Ledger, isolation: str = "read_committed", deadline_seconds: float = 60
    ) -> VerifyReport:
        """The sink against `ledger`, read with `isolation`."""
        return verify_sink(self.settings, ledger, isolation, deadline_seconds=deadline_seconds)

    @property
    def last_windows_seconds(self) -> float:
        """How long after the traffic ends the job's idle heartbeats take to emit the last
        windows: idle timeout + window + watermark delay."""
        job = self.settings.job
        return job.idle_timeout_seconds + job.window_seconds + job.watermark_delay_seconds

    def await_exact(
        self,
        ledger: Ledger,
        seconds: float,
        *,
        tick: Callable[[], object] = lambda: None,
        ready: Callable[[], bool] = lambda: True,
    ) -> VerifyReport | None:
        """Verify (read_committed) every few seconds until exact and `ready()`, or `seconds`
        pass: the last windows come a few batches after the traffic. `tick()` runs before each
        check (keep the job running). The last report; None: the sink could not be read yet."""
        deadline = time.monotonic() + seconds
        report: VerifyReport | None = None
        while time.monotonic() < deadline:
            tick()
            try:
                report = self.verify(ledger)
            except IpcountError as exc:
                logger.info("verify not yet possible: %s", exc)
            if report is not None and report.exact and ready():
                break
            time.sleep(3)
        return report

    def close(self) -> None:
        """Stop the broker or cluster this run started."""
        if self.broker is not None and self.own_broker:
            self.broker.stop()
        if self.cluster is not None:
            for node in self.cluster.members():
                node.resume()  # a node left hung by an interrupted fault would not stop
            self.cluster.stop()
