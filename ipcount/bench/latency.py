"""`ipcount bench latency`: for each result, the time from its window's end to the moment a
read_committed consumer receives it, while `loadgen synth --rate R` runs steadily (wall-clock
event time); percentiles per rate, next to the theoretical floor. Bench process side.
"""

from __future__ import annotations

import argparse
import re
import signal
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ipcount.bench.commit_watch import CommitWatcher, Received, percentile
from ipcount.childproc import Child
from ipcount.errors import ConfigError, IpcountError

if TYPE_CHECKING:
    from ipcount.bench.job_launcher import JobRun
    from ipcount.bench.options import Say
    from ipcount.bench.workspace import BenchEnv
    from ipcount.config import Settings

__all__ = ["run_latency"]

_STARTED_TIMEOUT_S = 600.0
_SYNTH_START = re.compile(r"event time from (-?\d+)")
# Start the next rate's generator this long before the current one ends, so input never pauses
# (a pause longer than job.idle_timeout_seconds would let heartbeats close windows instead).
_OVERLAP_S = 3.0
# The warm-up gives up when no window was committed this long after --warmup.
_WARMUP_LIMIT_S = 600.0
_WARMUP_WINDOWS = 2


@dataclass
class _Phase:
    rate: float
    duration: float
    ledger: Path
    log: Path
    proc: Child | None = None
    start_ms: int | None = None
    measured: bool = True
    results: list[Received] = field(default_factory=list)


def _launch_synth(env: BenchEnv, overrides: list[str], phase: _Phase, ips: int) -> None:
    from ipcount.local_pipeline.children import SynthProcess, child_env

    synth = SynthProcess(
        env.cli(overrides), rate=phase.rate, duration=phase.duration, ips=ips,
        ledger=phase.ledger, log_path=phase.log, env=child_env(),
    )  # fmt: skip
    phase.proc = synth.child


def _await_start(phase: _Phase, timeout: float = 120.0) -> int:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        match = _SYNTH_START.search(phase.log.read_text(errors="replace"))
        if match:
            phase.start_ms = int(match.group(1))
            return phase.start_ms
        if phase.proc is not None and phase.proc.poll() is not None:
            break
        time.sleep(0.05)
    raise IpcountError(f"synth did not start: {phase.log.read_text(errors='replace')[-2000:]}")


def _await_warm(watcher: CommitWatcher, start_ms: int, minimum_s: float) -> None:
    """Until `minimum_s` passed and the job committed a few windows of the warm-up's records."""
    deadline = time.monotonic() + minimum_s + _WARMUP_LIMIT_S
    while time.monotonic() < deadline:
        windows = {r.window_start for r in watcher.received if r.window_start >= start_ms}
        if len(windows) >= _WARMUP_WINDOWS and time.time() >= start_ms / 1000 + minimum_s:
            return
        if watcher.error is not None:
            raise IpcountError(f"sink watcher failed: {watcher.error}")
        time.sleep(0.5)
    raise IpcountError("warm-up: the job committed no windows; see its log (--keep)")


def _finish_synth(phase: _Phase) -> None:
    # The warm-up is stopped by SIGINT: exit status 130 after a clean flush and ledger save.
    ok = (0,) if phase.measured else (0, 130)
    if phase.proc is not None and phase.proc.wait(phase.duration + 300) not in ok:
        raise IpcountError(f"synth failed: {phase.log.read_text(errors='replace')[-2000:]}")


@dataclass(frozen=True)
class _Timing:
    """The job's event-time settings that bound a result's latency (seconds)."""

    delay: float
    trigger: float
    window: float
    idle_timeout: float

    @property
    def settle(self) -> float:
        # The first window after a rate change is left out of that rate's figures.
        return self.window


def _timing(args: argparse.Namespace, settings: Settings) -> tuple[list[float], _Timing]:
    """The rates, and the job's timing; checks that a phase holds a measured window.

    Raises:
        ConfigError: a bad --rates, --duration or --warmup.
    """
    rates = [float(r) for r in args.rates.split(",") if r.strip()]
    if not rates or min(rates) <= 0 or args.duration <= 0 or args.warmup < 0:
        raise ConfigError("--rates must list positive rates; --duration > 0; --warmup >= 0")
    job = settings.job
    t = _Timing(
        job.watermark_delay_seconds,
        job.trigger_interval_seconds,
        job.window_seconds,
        job.idle_timeout_seconds,
    )
    if args.duration < t.settle + t.delay + t.trigger + t.window:
        raise ConfigError(
            f"--duration {args.duration:g} is too short: a phase needs at least "
            f"{t.settle + t.delay + t.trigger + t.window:g}s for one measured window"
        )
    return rates, t


def run_latency(args: argparse.Namespace, settings: Settings, say: Say) -> int:
    """Run the job (processing-time trigger) and the rate phases; percentiles per rate, a line
    each to `say`."""
    from ipcount.bench.job_launcher import finish_job_child, start_job_child
    from ipcount.bench.workspace import bench_env
    from ipcount.kafka.topics import ensure_topics

    rates, timing = _timing(args, settings)
    with bench_env(settings, args.bootstrap, args.overrides, keep=args.keep) as env:
        run_settings, overrides = env.settings(
            "latency", f"topics.source_partitions={args.partitions}"
        )
        ensure_topics(run_settings)
        result_path = env.workdir / "job-latency.json"
        job = start_job_child(
            env, overrides, result_path, available_now=False, spark_conf=spark_conf_of(args),
            timeout=args.warmup + len(rates) * args.duration + 900,
        )  # fmt: skip
        watcher = CommitWatcher(run_settings)
        watcher.start()
        phases: list[_Phase] = []
        try:
            query_s = _await_query(job.child, result_path) - job.launched
            say(
                f"bench latency: broker {env.bootstrap}; job query started {query_s:.1f}s after "
                f"launch; trigger {timing.trigger:g}s, window {timing.window:g}s, watermark delay "
                f"{timing.delay:g}s, idle timeout {timing.idle_timeout:g}s; {args.ips} IPs, "
                f"{args.partitions} partitions"
            )
            _run_phases(env, overrides, watcher, rates, args, phases, say)
            report = _verify_phases(run_settings, phases)
        except BaseException:
            job.abandon()
            raise
        finally:
            watcher.stop()
            for phase in phases:
                if phase.proc is not None:
                    phase.proc.send_signal(signal.SIGTERM)
            # A clean stop (a micro-batch in flight is cancelled and replayed at the next start).
            job.child.send_signal(signal.SIGTERM)
        run = finish_job_child(job, 300)
        for line in _report(phases, watcher.received, run.result, timing):
            say(line)
        for line in _resource_lines(run):
            say(line)
        say(f"bench latency: verify {report.summary()}")
    return 0 if report.exact else 1


def _await_query(child: Child, result_path: Path) -> float:
    """When the job's query started (epoch s), from the file the job child writes then."""
    from ipcount.bench.timed_job import STARTED_SUFFIX

    started = result_path.with_name(result_path.name + STARTED_SUFFIX)
    deadline = time.monotonic() + _STARTED_TIMEOUT_S
    while not started.exists():
        if child.poll() is not None or time.monotonic() > deadline:
            raise IpcountError(f"the job did not start; log: {child.log}")
        time.sleep(0.2)
    return float(started.read_text())


def _run_phases(
    env: BenchEnv,
    overrides: list[str],
    watcher: CommitWatcher,
    rates: list[float],
    args: argparse.Namespace,
    phases: list[_Phase],
    say: Say,
) -> None:
    """The warm-up, then one generator per rate, back to back; appends each to `phases` as it
    starts (so the caller stops them all on failure) and says so.

    The warm-up runs until the job has committed windows (Python workers started) and at least
    --warmup seconds passed; then it is stopped (SIGINT: flush, save ledger).
    """
    plan = [(rates[0], args.warmup + _WARMUP_LIMIT_S, False)]
    plan += [(r, args.duration, True) for r in rates]
    for i, (rate, duration, measured) in enumerate(plan):
        phase = _Phase(
            rate, duration, env.workdir / f"ledger-{i}.jsonl", env.workdir / f"synth-{i}.log",
            measured=measured,
        )  # fmt: skip
        _launch_synth(env, overrides, phase, args.ips)
        start_ms = _await_start(phase)
        if phases and not phases[-1].measured and phases[-1].proc is not None:
            phases[-1].proc.send_signal(signal.SIGINT)
        phases.append(phase)
        say(
            f"bench latency: {'phase' if measured else 'warm-up'} {rate:g}/s "
            f"{f'for {duration:g}s ' if measured else ''}(event time from {start_ms})"
        )
        if measured:
            # Sleep until shortly before this phase ends, then start the next one.
            time.sleep(max(0.0, start_ms / 1000 + duration - _OVERLAP_S - time.time()))
        else:
            _await_warm(watcher, start_ms, args.warmup - _OVERLAP_S)
        if watcher.error is not None:
            raise IpcountError(f"sink watcher failed: {watcher.error}")


def _verify_phases(settings: Settings, phases: list[_Phase]) -> Any:
    """Wait for every generator, then verify the sink against their ledgers together."""
    from ipcount.bench.workspace import verify_run
    from ipcount.verify.ledger import Ledger

    for phase in phases:
        _finish_synth(phase)
    ledger = Ledger.load_all([p.ledger for p in phases])
    return _await_exact(settings, ledger, verify_run, 120.0)


def _resource_lines(run: JobRun) -> list[str]:
    """Peak memory and CPU seconds of the job's processes, and the local broker's CPU."""
    from ipcount.bench.memory import fmt_mb

    m = run.memory
    span = run.exited - run.launched
    broker = (
        "broker=-"
        if m.cpu_broker is None
        else f"broker={m.cpu_broker:.1f} ({m.cpu_broker / span:.2f} of a core on average)"
    )
    return [
        f"bench latency: peak_rss_MB jvm={fmt_mb(m.jvm)} python_driver={fmt_mb(m.driver)} "
        f"python_workers={fmt_mb(m.workers)} total={fmt_mb(m.total)}",
        f"bench latency: cpu_s jvm={m.cpu_jvm:.1f} python={m.cpu_workers + m.cpu_driver:.1f} "
        f"{broker} over the job's {span:.0f}s",
    ]


def spark_conf_of(args: argparse.Namespace) -> dict[str, str]:
    from ipcount.bench.measure import spark_pairs

    return spark_pairs(args.spark_conf)


def _await_exact(settings: Settings, ledger: Any, verify: Any, timeout: float) -> Any:
    """The last windows close through idle heartbeats: verify until exact or timeout."""
    deadline = time.monotonic() + timeout
    while True:
        report = verify(settings, ledger)
        if report.exact or time.monotonic() > deadline:
            return report
        time.sleep(3)


def _report(
    phases: list[_Phase], received: list[Received], result: dict[str, Any], timing: _Timing
) -> list[str]:
    delay, trigger, window, settle = timing.delay, timing.trigger, timing.window, timing.settle
    floor = delay
    pace = (
        f"The source admits that record at once (it closes a window; other records wait for the "
        f"{trigger:g}s batch interval) unless a batch is running"
        if trigger > 0
        else "The next trigger reads that record"
    )
    lines = [
        f"bench latency: floor = watermark delay {delay:g}s. A window [s, s+{window:g}) is final "
        f"when the watermark (max event time - {delay:g}s) reaches its end, i.e. when a record "
        f"stamped end+{delay:g}s arrives: {delay:g}s after the end at the earliest. {pace}; the "
        "micro-batch that reads it moves the watermark, the next one (right after it) emits the "
        "window: add both batches' processing and the sink's Kafka commit. Event time has 1 s "
        "precision (a record carries its second, truncated): that shifts records into windows "
        "but does not move the floor.",
    ]
    progress = [
        (ev["at"], ev["progress"]) for ev in result.get("events", []) if ev["event"] == "progress"
    ]
    for phase in phases:
        if not phase.measured or phase.start_ms is None:
            continue
        lo = phase.start_ms + int(settle * 1000)
        hi = phase.start_ms + int((phase.duration - delay - trigger) * 1000)
        mine = [r for r in received if r.window_start >= lo and r.window_end <= hi]
        windows = {r.window_start for r in mine}
        in_phase = [p for at, p in progress if lo / 1000 <= at <= hi / 1000 + delay + 2 * trigger]
        batches = [p["durationMs"].get("triggerExecution", 0) / 1000 for p in in_phase]
        if not mine:
            lines.append(f"bench latency: rate={phase.rate:g}/s: no measured windows")
            continue
        lat = [r.latency_s for r in mine]
        batch_text = (
            f"batches={len(batches)} batch_s mean={sum(batches) / len(batches):.2f} "
            f"max={max(batches):.2f}"
            if batches
            else "batches=0"
        )
        lines.append(
            f"bench latency: rate={phase.rate:g}/s windows={len(windows)} results={len(mine)} "
            f"p50={percentile(lat, 50):.2f}s p95={percentile(lat, 95):.2f}s "
            f"p99={percentile(lat, 99):.2f}s min={min(lat):.2f}s max={max(lat):.2f}s "
            f"(floor {floor:g}s) {batch_text}"
        )
        if in_phase:
            mean = {
                k: sum(float(p["durationMs"].get(k, 0)) for p in in_phase) / len(in_phase) / 1000
                for k in ("latestOffset", "queryPlanning", "walCommit", "addBatch", "commitOffsets")
            }
            rows = sum(int(p.get("numInputRows") or 0) for p in in_phase) / len(in_phase)
            lines.append(
                f"bench latency:   rate={phase.rate:g}/s mean per batch: rows={rows:.0f} "
                + " ".join(f"{k}={v:.2f}s" for k, v in mean.items())
            )
    return lines
