"""A soak run (in the `ipcount soak` process): a local broker (or the configured one), fresh topics,
`loadgen synth` at a steady rate for the whole duration, and the live job, stopped every few
minutes (SIGTERM and SIGKILL in turn) and started again from its checkpoint. Every report interval
it samples what must stay flat in the job's age; at the end it verifies the output exactly."""

from __future__ import annotations

import json
import signal
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path

from ipcount.chaos.env import ChaosEnv, ChaosError
from ipcount.chaos.plan import ChaosOptions
from ipcount.chaos.processes import batch_ids, last_committed_batch
from ipcount.config import Settings
from ipcount.errors import ConfigError
from ipcount.hostpaths import tree_bytes
from ipcount.local.broker import free_port
from ipcount.local_pipeline.children import JobProcess
from ipcount.observe.state_store import figures_of, list_local_state
from ipcount.soak.probes import process_figures, topic_records
from ipcount.verify.compare import VerifyReport
from ipcount.verify.ledger import Ledger

__all__ = ["SoakOptions", "SoakSample", "SoakReport", "SoakRunner"]


@dataclass(frozen=True)
class SoakOptions:
    """Figures of one soak run (see `ipcount soak --help`)."""

    work_dir: Path = Path(".ipcount/soak")
    duration_seconds: float = 600.0
    rate: float = 2000.0
    # Seconds between job restarts (SIGTERM and SIGKILL in turn); 0: never.
    restart_every_seconds: float = 600.0
    report_every_seconds: float = 600.0
    ips: int = 2000
    seed: int = 1
    use_configured_broker: bool = False
    trigger_interval_seconds: float = 1.0
    # The rest of the run's figures (late and malformed fractions, idle and start timeouts) are
    # ChaosOptions' own.
    # More SECTION.KEY=VALUE settings for the job (after the soak's own: these win).
    sets: tuple[str, ...] = ()

    def validate(self) -> None:
        """Raises ConfigError naming the option to fix."""
        if self.duration_seconds <= 0 or self.rate <= 0:
            raise ConfigError("--duration and --rate must be positive")
        if self.restart_every_seconds < 0 or self.report_every_seconds <= 0:
            raise ConfigError("--restart-every must be 0 or more, --report-every positive")
        if self.rate * self.duration_seconds < 100:
            raise ConfigError("--rate x --duration must be at least 100 records")


def _chaos_options(options: SoakOptions) -> ChaosOptions:
    """The chaos environment a soak runs in: --rate x --duration records, no injected faults, and
    every figure the two option sets name alike (work dir, rate, IPs, seed, broker, trigger
    interval) as the soak has it; ChaosOptions' defaults for the rest."""
    alike = {f.name for f in fields(ChaosOptions)} & {f.name for f in fields(SoakOptions)}
    return ChaosOptions(
        records=int(options.rate * options.duration_seconds),
        kills=0,
        broker_restarts=0,
        **{name: getattr(options, name) for name in alike},
    )


@dataclass
class SoakSample:
    """One report interval: what happened in it, and the figures at its end."""

    age_s: float
    batches: int  # committed in the interval
    batch_id: int  # the last committed batch id
    restarts: list[str] = field(default_factory=list)  # "SIGTERM" / "SIGKILL"
    restart_to_first_batch_s: list[float] = field(default_factory=list)
    checkpoint_bytes: int = 0
    checkpoint_files: int = 0
    log_entries: int = 0  # offsets/ and commits/ entries Spark keeps
    state_files: int = 0
    state_bytes: int = 0
    changelogs: int = 0
    snapshots: int = 0
    snapshot_version: int = 0
    driver_rss: int = 0
    workers_rss: int = 0
    fds: int = 0
    progress_records: int = 0  # what a reader of the progress topic finds (compacted)
    progress_offsets: int = 0  # the offsets it spans (grow with every marker)
    health: str = ""

    def line(self) -> str:
        first = "/".join(f"{s:.1f}" for s in self.restart_to_first_batch_s) or "-"
        mib = 1024 * 1024
        return (
            f"age={self.age_s / 60:.1f}min batches={self.batches} batch={self.batch_id} "
            f"restarts={','.join(self.restarts) or '-'} first_batch_s={first} "
            f"checkpoint={self.checkpoint_bytes / mib:.1f}MiB/{self.checkpoint_files}f "
            f"log_entries={self.log_entries} state={self.state_bytes / mib:.1f}MiB/"
            f"{self.state_files}f changelogs={self.changelogs} snapshots={self.snapshots} "
            f"snapshot_v={self.snapshot_version} driver_rss={self.driver_rss / mib:.0f}MiB "
            f"workers_rss={self.workers_rss / mib:.0f}MiB fds={self.fds} "
            f"progress_records={self.progress_records}/{self.progress_offsets}offsets "
            f"health={self.health!r}"
        )


@dataclass
class SoakReport:
    run_dir: Path
    samples: list[SoakSample] = field(default_factory=list)
    records: int = 0
    unplanned_exits: list[str] = field(default_factory=list)
    verify: VerifyReport | None = None
    seconds: float = 0.0

    @property
    def exact(self) -> bool:
        return self.verify is not None and self.verify.exact and not self.unplanned_exits


class SoakRunner:
    """One soak run; `run()` returns its report. Progress goes to `on_note`, samples to
    `on_sample` (and, as JSON lines, to RUN_DIR/samples.jsonl)."""

    def __init__(
        self,
        settings: Settings,
        options: SoakOptions,
        on_note: Callable[[str], None] = lambda s: None,
        on_sample: Callable[[SoakSample], None] = lambda s: None,
    ) -> None:
        options.validate()
        self.options, self.on_note, self.on_sample = options, on_note, on_sample
        tag = uuid.uuid4().hex[:8]
        self.run_dir = Path(options.work_dir).resolve() / f"soak-{tag}"
        self.report = SoakReport(self.run_dir)
        self.env = ChaosEnv(
            settings, _chaos_options(options), seed=options.seed, rate=options.rate,
            run_dir=self.run_dir, tag=f"soak-{tag}", on_note=on_note,
        )  # fmt: skip
        self.job: JobProcess | None = None
        self.starts = 0
        self.port = 0
        self.t0 = time.monotonic()
        # The interval's restarts, and a restart waiting for its first batch: (signal, spawned).
        self._restarts: list[str] = []
        self._firsts: list[float] = []
        self._waiting: tuple[float, int | None] | None = None
        self._last_batch: int | None = None

    @property
    def checkpoint(self) -> Path:
        return self.env.checkpoint

    def _age(self) -> float:
        return time.monotonic() - self.t0

    def _start_job(self) -> JobProcess:
        self.starts += 1
        self.port = free_port()
        log = self.run_dir / f"job-{self.starts}.log"
        job = self.env.pipeline.start_job(
            log, args=["--metrics-port", str(self.port)], sets=self.options.sets
        )
        job.committed_at_start = last_committed_batch(self.checkpoint)
        self._waiting = (time.monotonic(), job.committed_at_start)
        self.on_note(f"job start {self.starts} (pid {job.pid}, log {log.name})")
        self.job = job
        return job

    def _restart(self, how: str) -> None:
        if self.job is None:
            return
        if how == "SIGKILL":
            self.job.kill()
        else:
            code = self.job.terminate()
            # A clean stop exits 0; a SIGTERM before the driver installed its handler (while its
            # JVM starts) ends it by the signal, which is as good: nothing was half done.
            if code not in (0, None, -signal.SIGTERM, 128 + signal.SIGTERM):
                self.report.unplanned_exits.append(
                    f"job {self.starts} exited {code} on SIGTERM: {self.job.log_tail(5)}"
                )
        self._restarts.append(how)
        self.on_note(f"{how} to job {self.starts} at {self._age() / 60:.1f} min")
        self._start_job()

    def _watch(self) -> None:
        """Note a started job's first committed batch; restart a job that died on its own."""
        job = self.job
        if job is None:
            return
        if not job.alive:
            why = f"job {self.starts} exited {job.returncode} on its own: {job.log_tail(8)}"
            self.report.unplanned_exits.append(why)
            self.on_note(why)
            self._start_job()
            return
        if self._waiting is not None:
            spawned, before = self._waiting
            now_batch = last_committed_batch(self.checkpoint)
            if now_batch is not None and (before is None or now_batch > before):
                self._firsts.append(time.monotonic() - spawned)
                self._waiting = None
            elif time.monotonic() - spawned > (limit := self.env.options.start_timeout_seconds):
                raise ChaosError(
                    f"job {self.starts} committed no batch in {limit:.0f}s: {job.log_tail(20)}"
                )

    def _health(self) -> str:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/healthz", timeout=5) as r:
                return f"{r.status} {r.read().decode(errors='replace').strip()}"
        except urllib.error.HTTPError as exc:
            return f"{exc.code} {exc.read().decode(errors='replace').strip()}"
        except OSError as exc:
            return f"unreachable ({exc})"

    def _sample(self) -> SoakSample:
        batch = last_committed_batch(self.checkpoint)
        last = self._last_batch
        done = 0 if batch is None else batch - (last if last is not None else -1)
        self._last_batch = batch if batch is not None else last
        ckpt_bytes, ckpt_files = tree_bytes(self.checkpoint)
        state = figures_of(list_local_state(str(self.checkpoint)) or [])
        procs = process_figures(self.job.pid) if self.job is not None else None
        progress = topic_records(self.env.settings, self.env.settings.topics.progress)
        sample = SoakSample(
            age_s=self._age(),
            batches=done,
            batch_id=-1 if batch is None else batch,
            restarts=self._restarts,
            restart_to_first_batch_s=self._firsts,
            checkpoint_bytes=ckpt_bytes,
            checkpoint_files=ckpt_files,
            log_entries=len(batch_ids(self.checkpoint / "offsets"))
            + len(batch_ids(self.checkpoint / "commits")),
            state_files=state.files,
            state_bytes=state.bytes,
            changelogs=state.changelogs,
            snapshots=state.snapshots,
            snapshot_version=state.snapshot_version,
            driver_rss=procs.driver_rss if procs else 0,
            workers_rss=procs.workers_rss if procs else 0,
            fds=procs.fds if procs else 0,
            progress_records=progress[0],
            progress_offsets=progress[1],
            health=self._health(),
        )
        self._restarts, self._firsts = [], []
        self.report.samples.append(sample)
        with open(self.run_dir / "samples.jsonl", "a", encoding="utf-8") as fh:
            fh.write(json.dumps(asdict(sample)) + "\n")
        self.on_sample(sample)
        return sample

    def run(self) -> SoakReport:
        """The whole soak (the broker and processes are stopped whatever happens)."""
        o = self.options
        try:
            self.env.open([])
            self.env.start_synth(int(o.rate * o.duration_seconds))
            self._start_job()
            next_restart = o.restart_every_seconds or float("inf")
            next_report = o.report_every_seconds
            restarts = 0
            while self.env.generating:
                self._watch()
                age = self._age()
                if age >= next_report:
                    self._sample()
                    next_report += o.report_every_seconds
                # A restart waits for the running job's first committed batch: a job stopped
                # before it (a restart interval shorter than a start) would never commit anything.
                if age >= next_restart and self._waiting is None:
                    self._restart(("SIGTERM", "SIGKILL")[restarts % 2])
                    restarts += 1
                    next_restart = max(next_restart + o.restart_every_seconds, age)
                time.sleep(1.0)
            self.env.check_synth(more=False)
            self._finish()
        finally:
            if self.job is not None:
                self.job.terminate(timeout=30)
            self.env.close()
            self.report.seconds = self._age()
        return self.report

    def _finish(self) -> None:
        ledger = Ledger.load_all(self.env.ledgers)
        self.report.records = ledger.records
        self.on_note(f"traffic done ({ledger.records} records); waiting for the last windows")
        pipeline = self.env.pipeline
        report = pipeline.await_exact(
            ledger,
            pipeline.last_windows_seconds + self.env.options.start_timeout_seconds,
            tick=self._watch,
            ready=lambda: self._waiting is None,
        )
        self._sample()
        self.report.verify = report
