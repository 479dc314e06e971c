"""`loadgen bench --latency`: for each result, the time from its window's end to the moment a
read_committed consumer receives it, while `loadgen synth --rate R` runs steadily (wall-clock
event time); percentiles per rate, next to the theoretical floor. Bench process side.
"""

from __future__ import annotations

import argparse
import math
import re
import signal
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from confluent_kafka import Consumer, TopicPartition

from ipcount.childproc import Child, spawn
from ipcount.errors import ConfigError, IpcountError
from ipcount.kafka.topic_reader import consumer_conf, partition_offsets

if TYPE_CHECKING:
    from ipcount.config import Settings
    from loadgen.bench.workspace import BenchEnv

__all__ = ["CommitWatcher", "Received", "percentile", "run_latency"]

# How often the watcher asks for the last stable offset (read_committed end) of each partition.
# Asking is one small request; fetching instead would spin (noida-db answers empty fetches at once).
_WATCH_INTERVAL_S = 0.02
_STARTED_TIMEOUT_S = 600.0
_SYNTH_START = re.compile(r"event time from (-?\d+)")
# Start the next rate's generator this long before the current one ends, so input never pauses
# (a pause longer than job.idle_timeout_seconds would let heartbeats close windows instead).
_OVERLAP_S = 3.0
# The warm-up gives up when no window was committed this long after --warmup.
_WARMUP_LIMIT_S = 600.0
_WARMUP_WINDOWS = 2


@dataclass(frozen=True)
class Received:
    """One committed result and when this process received it (epoch ms)."""

    at_ms: int
    window_start: int
    window_end: int
    ip: str
    count: int

    @property
    def latency_s(self) -> float:
        return (self.at_ms - self.window_end) / 1000


class CommitWatcher:
    """Follows the sink topic as a read_committed consumer and timestamps every record on receipt.

    It polls the last stable offset of each partition every 20 ms and fetches only when it moved,
    so it neither spins nor adds more than ~20 ms to a measured latency.
    """

    def __init__(self, settings: Settings) -> None:
        from ipcount.formats.avro import make_codec

        self.topic = settings.topics.sink
        self._codec = make_codec(
            settings.sink.wire_format, settings.sink.schema_registry_url, settings.topics.sink
        )
        conf = consumer_conf(settings.kafka.to_librdkafka("consumer"), "read_committed", "bench")
        self._consumer = Consumer(conf)
        md = self._consumer.list_topics(self.topic, timeout=10)
        self._next = {p: 0 for p in md.topics[self.topic].partitions}
        self.received: list[Received] = []
        self.error: BaseException | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="bench-watch", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(10)
        self._consumer.close()

    def _run(self) -> None:
        try:
            while not self._stop.wait(_WATCH_INTERVAL_S):
                self._check()
        except BaseException as exc:  # reported by run_latency
            self.error = exc

    def _check(self) -> None:
        consumer = self._consumer
        ends = {}
        for p, pos in self._next.items():
            # read_committed: the last stable offset, i.e. what a read_committed reader can see.
            # A new sink topic's leader may be unknown for a moment: partition_offsets retries.
            _, high = partition_offsets(consumer, self.topic, p, 10.0)
            if high > pos:
                ends[p] = high
        if not ends:
            return
        consumer.assign([TopicPartition(self.topic, p, self._next[p]) for p in ends])
        try:
            while ends:
                # consume() waits out its timeout unless 10k records arrive, and a record's
                # arrival is stamped after it returns: a short one, or latency reads up to 0.5 s
                # high.
                msgs = consumer.consume(10_000, 0.05)
                now_ms = int(time.time() * 1000)
                for m in msgs:
                    if m.error() is not None:
                        continue
                    rec = self._codec.decode(m.value())  # type: ignore[arg-type]
                    self.received.append(
                        Received(now_ms, rec.window_start, rec.window_end, rec.ip, rec.count)
                    )
                for tp in consumer.position([TopicPartition(self.topic, p) for p in list(ends)]):
                    if tp.offset >= 0:
                        self._next[tp.partition] = max(self._next[tp.partition], tp.offset)
                    if self._next[tp.partition] >= ends[tp.partition]:
                        del ends[tp.partition]
        finally:
            consumer.unassign()


def percentile(values: list[float], q: float) -> float:
    """Nearest-rank percentile (q in 0..100) of a non-empty list."""
    ordered = sorted(values)
    rank = max(1, math.ceil(q / 100 * len(ordered)))
    return ordered[rank - 1]


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
    cmd = [sys.executable, "-m", "loadgen"]
    if env.config:
        cmd += ["--config", env.config]
    for item in overrides:
        cmd += ["--set", item]
    cmd += [
        "synth", "--rate", f"{phase.rate:g}", "--duration", f"{phase.duration:g}",
        "--ips", str(ips), "--ledger", str(phase.ledger),
    ]  # fmt: skip
    phase.proc = spawn(cmd, log=phase.log, name="synth", own_session=False, append=False)


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


def run_latency(args: argparse.Namespace, settings: Settings) -> int:
    """Run the job (processing-time trigger) and the rate phases; print percentiles per rate."""
    from ipcount.kafka.topics import ensure_topics
    from ipcount.verify.ledger import Ledger
    from loadgen.bench.job_child import finish_job_child, start_job_child, stop_job_child
    from loadgen.bench.job_process import STARTED_SUFFIX
    from loadgen.bench.memory import MemorySampler, fmt_mb
    from loadgen.bench.workspace import bench_env, verify_run

    rates = [float(r) for r in args.rates.split(",") if r.strip()]
    if not rates or min(rates) <= 0 or args.duration <= 0 or args.warmup < 0:
        raise ConfigError("--rates must list positive rates; --duration > 0; --warmup >= 0")
    job = settings.job
    delay, trigger, window = (
        job.watermark_delay_seconds,
        job.trigger_interval_seconds,
        job.window_seconds,
    )
    settle = window
    if args.duration < settle + delay + trigger + window:
        raise ConfigError(
            f"--duration {args.duration:g} is too short: a phase needs at least "
            f"{settle + delay + trigger + window:g}s for one measured window"
        )
    with bench_env(settings, args.bootstrap, args.overrides, keep=args.keep) as env:
        run_settings, overrides = env.settings(
            "latency", f"topics.source_partitions={args.partitions}"
        )
        ensure_topics(run_settings)
        result_path = env.workdir / "job-latency.json"
        total = args.warmup + len(rates) * args.duration
        launched = time.time()
        child = start_job_child(
            env, overrides, result_path, available_now=False,
            spark_conf=spark_conf_of(args), timeout=total + 900,
        )  # fmt: skip
        sampler = MemorySampler(child.pid, broker_pid=env.broker_pid).__enter__()
        watcher = CommitWatcher(run_settings)
        watcher.start()
        phases: list[_Phase] = []
        try:
            started = result_path.with_name(result_path.name + STARTED_SUFFIX)
            deadline = time.monotonic() + _STARTED_TIMEOUT_S
            while not started.exists():
                if child.poll() is not None or time.monotonic() > deadline:
                    raise IpcountError(f"the job did not start; log: {child.log}")
                time.sleep(0.2)
            print(
                f"bench latency: broker {env.bootstrap}; job query started "
                f"{float(started.read_text()) - launched:.1f}s after launch; trigger {trigger:g}s, "
                f"window {window:g}s, watermark delay {delay:g}s, idle timeout "
                f"{job.idle_timeout_seconds:g}s; {args.ips} IPs, {args.partitions} partitions",
                flush=True,
            )
            # The warm-up runs until the job has committed windows (Python workers started) and
            # at least --warmup seconds passed; then it is stopped (SIGINT: flush, save ledger).
            plan = [(rates[0], args.warmup + _WARMUP_LIMIT_S, False)]
            plan += [(r, args.duration, True) for r in rates]
            for i, (rate, duration, measured) in enumerate(plan):
                phase = _Phase(
                    rate, duration, env.workdir / f"ledger-{i}.jsonl",
                    env.workdir / f"synth-{i}.log", measured=measured,
                )  # fmt: skip
                _launch_synth(env, overrides, phase, args.ips)
                start_ms = _await_start(phase)
                if phases and not phases[-1].measured and phases[-1].proc is not None:
                    phases[-1].proc.send_signal(signal.SIGINT)
                phases.append(phase)
                print(
                    f"bench latency: {'phase' if measured else 'warm-up'} {rate:g}/s "
                    f"{f'for {duration:g}s ' if measured else ''}(event time from {start_ms})",
                    flush=True,
                )
                if measured:
                    # Sleep until shortly before this phase ends, then start the next one.
                    time.sleep(max(0.0, start_ms / 1000 + duration - _OVERLAP_S - time.time()))
                else:
                    _await_warm(watcher, start_ms, args.warmup - _OVERLAP_S)
                if watcher.error is not None:
                    raise IpcountError(f"sink watcher failed: {watcher.error}")
            for phase in phases:
                _finish_synth(phase)
            ledger = Ledger.load_all([p.ledger for p in phases])
            report = _await_exact(run_settings, ledger, verify_run, 120.0)
        except BaseException:
            stop_job_child(child)
            sampler.__exit__()
            raise
        finally:
            watcher.stop()
            for phase in phases:
                if phase.proc is not None:
                    phase.proc.send_signal(signal.SIGTERM)
            # The job stops after its current micro-batch.
            child.send_signal(signal.SIGTERM)
        run = finish_job_child(child, sampler, launched, result_path, 300)
        lines = _report(phases, watcher.received, run.result, delay, trigger, window, settle)
        for line in lines:
            print(line, flush=True)
        m = run.memory
        print(
            f"bench latency: peak_rss_MB jvm={fmt_mb(m.jvm)} python_driver={fmt_mb(m.driver)} "
            f"python_workers={fmt_mb(m.workers)} total={fmt_mb(m.total)}"
        )
        span = run.exited - run.launched
        print(
            f"bench latency: cpu_s jvm={m.cpu_jvm:.1f} python={m.cpu_workers + m.cpu_driver:.1f} "
            + (
                "broker=-"
                if m.cpu_broker is None
                else f"broker={m.cpu_broker:.1f} ({m.cpu_broker / span:.2f} of a core on average)"
            )
            + f" over the job's {span:.0f}s"
        )
        print(f"bench latency: verify {report.summary()}", flush=True)
    return 0 if report.exact else 1


def spark_conf_of(args: argparse.Namespace) -> dict[str, str]:
    from loadgen.bench.measure import spark_pairs

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
    phases: list[_Phase],
    received: list[Received],
    result: dict[str, Any],
    delay: float,
    trigger: float,
    window: float,
    settle: float,
) -> list[str]:
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
