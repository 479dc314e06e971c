"""What the throughput, latency, scaling and costs benchmarks share: the pre-load plan, one
measured AvailableNow run of the job and its final line. Bench process side."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

from ipcount.errors import ConfigError
from loadgen.generator import SynthSpec

if TYPE_CHECKING:  # the bench machinery is imported when a benchmark runs, not by every CLI call
    import argparse
    from pathlib import Path

    from ipcount.bench.job_launcher import JobRun
    from ipcount.bench.report import PhaseTotals, StageTotals
    from ipcount.bench.sink_share import SinkShare
    from ipcount.bench.workspace import BenchEnv
    from ipcount.config import Settings
    from ipcount.verify.ledger import Ledger
    from loadgen.synth import SynthResult

__all__ = [
    "PreloadPlan",
    "RunFigures",
    "RunKnobs",
    "measure_run",
    "plan_preload",
    "synth_spec",
    "final_line",
    "fmt_num",
    "spark_pairs",
]


def synth_spec(
    settings: Settings, ips: int, skew: float, event_rate: float, seed: int
) -> SynthSpec:
    """The pre-load spec: on-time records only (no late/malformed), default jitter."""
    spec = SynthSpec(
        ips=ips,
        skew=skew,
        event_rate=event_rate,
        seed=seed,
        window_ms=int(settings.job.window_seconds * 1000),
        watermark_delay_seconds=settings.job.watermark_delay_seconds,
    )
    spec.validate()
    return spec


@dataclass(frozen=True)
class PreloadPlan:
    """A fresh source topic to pre-load: its settings, the overrides that rebuild them in the
    job's process, the generator's spec and the first event time."""

    settings: Settings
    overrides: list[str]
    spec: SynthSpec
    start_ms: int

    def load(self, records: int, ledger_path: Path) -> SynthResult:
        """Create the topics and load `records` records; the ledger goes to `ledger_path`."""
        from ipcount.bench.workspace import preload

        return preload(self.settings, records, self.spec, self.start_ms, ledger_path)

    def measure(
        self, env: BenchEnv, name: str, records: int, ledger_path: Path, knobs: RunKnobs
    ) -> RunFigures:
        """measure_run over the records load() wrote, verified against the ledger it wrote."""
        from ipcount.verify.ledger import Ledger

        return measure_run(env, self.overrides, name, records, Ledger.load(ledger_path), knobs)


def plan_preload(
    env: BenchEnv,
    tag: str,
    args: argparse.Namespace,
    *extra: str,
    partitions: int | None = None,
    ips: int | None = None,
    skew: float | None = None,
) -> PreloadPlan:
    """The source of a pre-loading benchmark, shaped by its load options (--partitions, --ips,
    --skew, --event-rate, --seed, --start) unless `partitions`, `ips` or `skew` say otherwise (a
    scaling cell); `extra` are more setting overrides for the job."""
    from ipcount.bench.workspace import DEFAULT_START_MS
    from loadgen.generator import parse_start

    part = args.partitions if partitions is None else partitions
    settings, overrides = env.settings(tag, f"topics.source_partitions={part}", *extra)
    spec = synth_spec(
        settings,
        args.ips if ips is None else ips,
        args.skew if skew is None else skew,
        args.event_rate,
        args.seed,
    )
    start_ms = parse_start(args.start) if args.start else DEFAULT_START_MS
    return PreloadPlan(settings, overrides, spec, start_ms)


@dataclass
class RunFigures:
    """One measured AvailableNow run."""

    name: str
    records: int
    results: int
    exact: bool
    verify: str
    job: JobRun
    phases: PhaseTotals
    stages: StageTotals
    settings: Settings
    # The sink tasks' share: results through the driver (0), the slowest task per batch.
    sink: SinkShare | None = None

    @property
    def seconds(self) -> float:
        return self.job.run_s

    @property
    def rate(self) -> float:
        return self.records / self.seconds if self.seconds > 0 else 0.0

    @property
    def sustained_rate(self) -> float | None:
        """Events/s after the first data batch (None: fewer than two data batches)."""
        s = self.job.sustained
        return None if s is None else s.rate

    @property
    def launch_to_visible_s(self) -> float:
        return self.job.launch_to_visible_s

    @property
    def jvm_cpu_per_1m(self) -> float | None:
        """JVM CPU seconds (the job process's whole life) per 1,000,000 records."""
        return self.job.memory.cpu_jvm * 1e6 / self.records if self.records > 0 else None


@dataclass(frozen=True)
class RunKnobs:
    """How a benchmark starts each measured run of the job: its `--spark-conf` pairs, whether
    Spark's event log is written (the stage figures; `--no-event-log`), and `--timeout`."""

    spark_conf: dict[str, str]
    event_log: bool = True
    timeout: float = 3600.0

    @staticmethod
    def from_args(args: argparse.Namespace) -> RunKnobs:
        """The knobs of a benchmark's command line (checked before anything starts).

        Raises:
            ConfigError: a --spark-conf item is not KEY=VALUE.
        """
        return RunKnobs(spark_pairs(args.spark_conf), not args.no_event_log, args.timeout)


def measure_run(
    env: BenchEnv,
    overrides: list[str],
    name: str,
    records: int,
    ledger: Ledger,
    knobs: RunKnobs,
    *,
    child_env: dict[str, str] | None = None,
) -> RunFigures:
    """Run the job once over the pre-loaded source (fresh sink and checkpoint), then verify."""
    from ipcount.bench.job_launcher import run_job_child
    from ipcount.bench.report import StageTotals, event_log_conf, phase_totals, stage_totals
    from ipcount.bench.sink_share import sink_share
    from ipcount.bench.workspace import verify_run
    from ipcount.kafka.topics import ensure_topics

    settings, overrides = env.with_sink(overrides, name)
    ensure_topics(settings)
    conf = dict(knobs.spark_conf)
    events_dir = env.workdir / f"events-{name}-{time.monotonic_ns()}"
    if knobs.event_log:
        conf.update(event_log_conf(events_dir))
    job = run_job_child(
        env, overrides, name, spark_conf=conf, timeout=knobs.timeout, extra_env=child_env
    )
    report = verify_run(settings, ledger)
    stages = stage_totals(events_dir) if knobs.event_log else StageTotals()
    return RunFigures(
        name, records, report.results, report.exact, report.summary(), job,
        phase_totals(job.progress), stages, settings, sink_share(settings, report.records, job.log),
    )  # fmt: skip


def final_line(fig: RunFigures) -> str:
    """`bench: records=N seconds=S events_per_s=R results=K exact=true|false
    sustained_events_per_s=X launch_to_visible_s=Y` (X is `-` below two data batches)."""
    return (
        f"bench: records={fig.records} seconds={fig.seconds:.2f} events_per_s={fig.rate:.0f} "
        f"results={fig.results} exact={'true' if fig.exact else 'false'} "
        f"sustained_events_per_s={fmt_num(fig.sustained_rate, 0)} "
        f"launch_to_visible_s={fig.launch_to_visible_s:.1f}"
    )


def fmt_num(value: float | None, digits: int = 1) -> str:
    """A figure with `digits` decimals, `-` when there is none."""
    return "-" if value is None else f"{value:.{digits}f}"


def spark_pairs(items: list[str]) -> dict[str, str]:
    out = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise ConfigError(f"--spark-conf {item!r}: expected KEY=VALUE")
        out[key.strip()] = value.strip()
    return out
