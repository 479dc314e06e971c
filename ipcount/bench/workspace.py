"""Where a pipeline benchmark runs (bench process): a local pipeline's broker (or a given one) and
fresh topics per run, the records pre-loaded with synth's generator, the sink verified against
the ledger."""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import tempfile
import uuid
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from ipcount.config import Settings, load_settings
from ipcount.errors import IpcountError
from ipcount.kafka.topics import ensure_topics
from ipcount.local.broker import free_port
from ipcount.local.kinds import make_broker
from ipcount.local_pipeline.steps import LocalPipeline, settings_cli, topic_overrides
from ipcount.verify.compare import VerifyReport, verify_sink
from ipcount.verify.ledger import Ledger
from loadgen.generator import SynthSpec
from loadgen.synth import SynthOptions, SynthResult, run_synth

__all__ = ["DEFAULT_START_MS", "BenchEnv", "bench_env", "own_broker", "preload", "verify_run"]

# Historical event time for pre-loaded records: fixed, so runs are comparable (2026-01-01 UTC).
DEFAULT_START_MS = 1_767_225_600_000


@dataclass
class BenchEnv:
    """Where a benchmark runs: a broker (own or given), a work directory, the base settings."""

    bootstrap: str
    workdir: Path
    config: str | None
    overrides: list[str]
    # PID of the benchmark's own broker (its CPU is reported: it shares the cores with the job);
    # None on a given --bootstrap cluster.
    broker_pid: int | None = None
    topics: list[str] = field(default_factory=list)

    @property
    def own_broker(self) -> bool:
        return self.broker_pid is not None

    def settings(self, tag: str, *extra: str) -> tuple[Settings, list[str]]:
        """Settings with fresh topics and checkpoint named after `tag`; also the override list
        that rebuilds them in a child process."""
        uid = _topic_safe(f"{tag}-{uuid.uuid4().hex[:6]}")
        overrides = [
            *self.overrides,
            f"kafka.bootstrap_servers={self.bootstrap}",
            *topic_overrides(f"bench-{uid}"),
            f"job.checkpoint_location={self.workdir / ('ckpt-' + uid)}",
            *extra,
        ]
        return self._load(overrides), overrides

    def cli(self, overrides: Sequence[str]) -> list[str]:
        """A child's `--config FILE --set ...` for a run's `overrides`."""
        return settings_cli(self.config, overrides)

    def _load(self, overrides: list[str]) -> Settings:
        settings = load_settings(self.config, overrides=overrides)
        t = settings.topics
        self.topics += [t.source, t.sink, t.progress, t.late, t.dead_letter]
        return settings

    def with_sink(self, overrides: Sequence[str], tag: str) -> tuple[Settings, list[str]]:
        """The same source topic, with fresh sink/progress topics and checkpoint (re-read the
        pre-loaded source in another configuration)."""
        uid = _topic_safe(f"{tag}-{uuid.uuid4().hex[:6]}")
        fresh = [
            *overrides,
            *topic_overrides(f"bench-{uid}", ("sink", "progress")),
            f"job.checkpoint_location={self.workdir / ('ckpt-' + uid)}",
        ]
        return self._load(fresh), fresh

    def delete_topics(self) -> None:
        """Delete the topics this benchmark named (on a given --bootstrap cluster)."""
        from confluent_kafka.admin import AdminClient

        from ipcount.kafka.client import with_client_logging

        base = load_settings(
            self.config, overrides=[*self.overrides, f"kafka.bootstrap_servers={self.bootstrap}"]
        )
        admin = AdminClient(with_client_logging(base.kafka.to_librdkafka("admin")))
        existing = set(admin.list_topics(timeout=10).topics)
        doomed = sorted(set(self.topics) & existing)
        for fut in admin.delete_topics(doomed).values() if doomed else ():
            with contextlib.suppress(Exception):
                fut.result(timeout=30)


def _topic_safe(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]", "-", text)


@contextlib.contextmanager
def bench_env(
    settings: Settings, bootstrap: str | None, overrides: Sequence[str], keep: bool = False
) -> Iterator[BenchEnv]:
    """A temp work dir and a broker: `bootstrap` if given, else the configured local broker kind
    ([broker] kind) on a free port,
    stopped by PID at the end."""
    config = (
        None if settings.source_path == "defaults" else str(Path(settings.source_path).resolve())
    )
    tmp = tempfile.mkdtemp(prefix="ipcount-bench-")
    pipeline = LocalPipeline(settings, Path(tmp), None)
    env: BenchEnv | None = None
    try:
        if not bootstrap:
            bootstrap = pipeline.open_broker()
        env = BenchEnv(bootstrap, Path(tmp), config, list(overrides), pipeline.broker_pid)
        yield env
    finally:
        if pipeline.own_broker:
            pipeline.close()
        elif env is not None and not keep:
            env.delete_topics()
        if not keep:
            shutil.rmtree(tmp, ignore_errors=True)


def preload(
    settings: Settings, count: int, spec: SynthSpec, start_ms: int, ledger_path: Path
) -> SynthResult:
    """Create the topics and load `count` records with loadgen synth's generator (as fast as
    possible, event time advancing spec.event_rate records per second from start_ms).

    Raises:
        IpcountError: a record was not delivered (the ledger would not match the topic).
    """
    ensure_topics(settings)
    options = SynthOptions(count=count, start_ms=start_ms, ledger_path=ledger_path)
    result = run_synth(settings, spec, options)
    if result.errors or result.unreported or result.records != count:
        raise IpcountError(f"pre-load failed: {result.summary()}")
    return result


def verify_run(settings: Settings, ledger: Ledger) -> VerifyReport:
    """Read the sink with read_committed and compare it with the ledger."""
    return verify_sink(settings, ledger, "read_committed", deadline_seconds=300)


@contextlib.contextmanager
def own_broker(bootstrap: str | None, prefix: str) -> Iterator[str]:
    """`bootstrap` if given; else a local broker of kind env IPCOUNT_BROKER_KIND (default kafka)
    on a free port with its data in a temp dir named `prefix`..., stopped by PID at the end."""
    if bootstrap:
        yield bootstrap
        return
    with tempfile.TemporaryDirectory(prefix=prefix) as tmp:
        broker = make_broker(
            os.environ.get("IPCOUNT_BROKER_KIND", "kafka"),
            Path(tmp) / "broker",
            "127.0.0.1",
            free_port(),
        )
        broker.start(timeout=30)
        try:
            yield broker.bootstrap
        finally:
            broker.stop()
