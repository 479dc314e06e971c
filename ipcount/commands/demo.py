"""`ipcount demo`: the whole pipeline on this machine — broker, topics, job, generator, live view,
verify. Traffic starts once the job has committed its first micro-batch, so windows show live."""

from __future__ import annotations

import argparse
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from ipcount.checkpoint.offset_log import OffsetLog
from ipcount.childproc import Child, spawn
from ipcount.config import Settings
from ipcount.local.broker import LocalBroker
from ipcount.local_pipeline.children import child_env
from ipcount.local_pipeline.steps import LocalPipeline

__all__ = ["register"]


_BROKER_NAMES = {
    "kafka": "a local Apache Kafka broker (KRaft, one node; broker.kind = kafka)",
    "noida-db": "a local noida-db broker (the JVM-free stand-in; broker.kind = noida-db)",
}
# How long the job may take to start Spark and commit its first (empty) micro-batch.
_JOB_START_SECONDS = 300.0
# The generator's late records: this share, up to this many seconds behind (a shipper's retries).
_LATE_FRACTION, _LATE_BEHIND_SECONDS = 0.001, 60
_OPEN = re.compile(r"\bopen=(\d+)\b")


def register(sub: Any) -> None:
    p = sub.add_parser(
        "demo",
        help="run the whole pipeline locally and print the top IPs per window",
        description="Start a fresh local broker, create the topics, start the Spark job, and once "
        "it has committed its first micro-batch generate access records while printing each "
        "window's top IPs as its read_committed results are committed (`ipcount top "
        "--follow`); when the traffic ends, wait until the job has emitted every window, then "
        "verify every count against the generator's ground truth (`ipcount verify`, open=0).",
    )
    p.add_argument("--dir", default=".ipcount/demo", help="working directory (wiped first)")
    p.add_argument("--rate", type=int, default=2000, help="records per second (default 2000)")
    p.add_argument("--duration", type=float, default=30.0, help="seconds of traffic (default 30)")
    p.add_argument("--ips", type=int, default=20, help="distinct client IPs (default 20)")
    p.add_argument("--top", type=int, default=5, help="IPs shown per window (default 5)")
    p.add_argument("--keep-broker", action="store_true", help="leave the broker running at the end")
    p.set_defaults(func=run)


def _say(msg: str) -> None:
    print(f"[demo] {msg}", flush=True)


def _wait_until_up(job: Child, checkpoints: list[Path]) -> bool:
    """Wait until every query of the job has committed a micro-batch (Spark, its Python workers
    and the sink are then warm: the first batch of a fresh query runs on empty input). False:
    the job stopped, or it did not get there within _JOB_START_SECONDS."""
    deadline = time.monotonic() + _JOB_START_SECONDS
    while time.monotonic() < deadline and job.poll() is None:
        if all(OffsetLog(str(c)).committed_ids() for c in checkpoints):
            return True
        time.sleep(0.5)
    return False


def _verify_until_closed(
    cmd: list[str], env: dict[str, str], job: Child, seconds: float
) -> subprocess.CompletedProcess[str] | None:
    """Run `ipcount verify` until it is exact with no window open (the job has emitted every
    window: its idle heartbeats close the last ones), the job stops, or `seconds` pass. An exact
    check alone is not enough: open windows do not make a run inexact, and the job's heartbeats
    emit the last windows a few batches after the traffic ends. Returns the last check."""
    deadline = time.monotonic() + seconds
    verify: subprocess.CompletedProcess[str] | None = None
    while time.monotonic() < deadline and job.poll() is None:
        verify = subprocess.run(cmd, env=env, capture_output=True, text=True)
        if verify.returncode == 0 and _open_windows(verify.stdout) == 0:
            break
        time.sleep(2)
    return verify


def _open_windows(verify_out: str) -> int | None:
    """open=N of `ipcount verify`'s summary (its last line); None: no summary."""
    lines = verify_out.strip().splitlines()
    found = _OPEN.search(lines[-1]) if lines else None
    return int(found.group(1)) if found else None


def _announce(broker: LocalBroker) -> None:
    what = _BROKER_NAMES.get(broker.kind, broker.kind)
    _say(f"starting {what} on {broker.bootstrap}, data in {broker.data_dir}")


def run(args: argparse.Namespace, settings: Settings) -> int:
    return _Demo(args, settings).run()


class _Demo:
    """One demo run, as named steps: broker, topics, job, live view, traffic, last windows,
    check. Every child it starts is stopped at the end, and the broker unless --keep-broker."""

    def __init__(self, args: argparse.Namespace, settings: Settings) -> None:
        self.args, self.settings = args, settings
        self.began = time.monotonic()
        self.work = Path(args.dir).resolve()
        self.ledger = self.work / "ledger.jsonl"
        job = settings.job
        # How long after the traffic the job's idle heartbeats take to emit the last windows.
        self.idle = job.idle_timeout_seconds + job.window_seconds + job.watermark_delay_seconds + 10
        self.env = child_env()
        self.procs: list[Child] = []
        # The demo's own broker, the configured topics, the checkpoint under --dir.
        self.pipeline = LocalPipeline(settings, self.work, None)
        self.checkpoint = self.pipeline.checkpoint
        self.ipcount = [sys.executable, "-m", "ipcount"]
        self.sets: list[str] = []

    def run(self) -> int:
        if self.work.exists():
            shutil.rmtree(self.work)
        self.work.mkdir(parents=True)
        self.pipeline.open_broker(announce=_announce)
        broker = self.pipeline.broker
        self.sets = self.pipeline.cli
        try:
            for name, state in self.pipeline.create_topics().items():
                _say(f"topic {name}: {state}")
            return self._steps()
        finally:
            for child in self.procs:
                child.stop(60)
                child.reap()
            if self.args.keep_broker and broker is not None:
                _say(f"broker left running on {broker.bootstrap} (pid in {broker.state_file})")
            else:
                self.pipeline.close()
                _say("broker stopped")

    def _steps(self) -> int:
        job = self._start_job()
        if job is None:
            return 1
        live = self._start_live_view()
        if not self._generate():
            return 1
        _say(
            f"traffic done; waiting for the last windows "
            f"(about {self.idle:.0f}s: idle timeout + window + delay)"
        )
        verify = _verify_until_closed(
            [*self.ipcount, *self.sets, "verify", "--ledger", str(self.ledger)],
            self.env,
            job,
            self.idle + 60,
        )
        if job.poll() is not None:
            _say(f"the job stopped unexpectedly (status {job.returncode}); see {self._log('job')}")
            return 1
        # top shows a window a moment after its commit: time for the last ones.
        if live.wait(timeout=4) is None:
            live.send_signal(signal.SIGINT)
            live.wait(timeout=30)
        _say("stopping the job (SIGTERM: a clean stop)")
        job.stop(120)
        return self._report(verify)

    def _log(self, name: str) -> Path:
        return self.work / f"{name}.log"

    def _spawn(self, argv: list[str], log: Path | None, name: str) -> Child:
        child = spawn(argv, log=log, name=name, env=self.env)
        self.procs.append(child)
        return child

    def _start_job(self) -> Child | None:
        """The Spark job, once it has committed its first micro-batch (None: it did not)."""
        _say(
            f"starting the Spark job (log: {self._log('job')}); the traffic starts once it has "
            "committed its first micro-batch"
        )
        launched = time.monotonic()
        job = self.pipeline.start_job(self._log("job"), env=self.env, name="the Spark job").child
        self.procs.append(job)
        queries = [self.checkpoint]
        if self.settings.job.dead_letter:
            queries.append(Path(f"{self.checkpoint}-dead-letter"))
        if not _wait_until_up(job, queries):
            why = "stopped" if job.poll() is not None else f"not up in {_JOB_START_SECONDS:g}s"
            _say(f"the Spark job {why}; see {self._log('job')}")
            return None
        _say(
            f"the job is up after {time.monotonic() - launched:.0f}s (first micro-batch committed)"
        )
        return job

    def _start_live_view(self) -> Child:
        """`ipcount top --follow`, printing to the demo's own output."""
        args = self.args
        _say(
            f"the top {args.top} IPs of each window, as its read_committed results are committed "
            "(ipcount top --follow); late records, seconds to a minute behind as a shipper's "
            "retries are, show as one corrections block per refresh:"
        )
        idle_exit = f"{args.duration + self.idle + 60:g}"
        top = ["top", "--follow", "--n", str(args.top), "--idle-exit", idle_exit]
        return self._spawn([*self.ipcount, *self.sets, *top], None, "the live view")

    def _generate(self) -> bool:
        """`loadgen synth` for --duration seconds; False when it failed."""
        args = self.args
        _say(
            f"generating {args.rate} records/s for {args.duration:g}s from {args.ips} IPs "
            f"(log: {self._log('loadgen')}, ground truth: {self.ledger})"
        )
        generator = self.pipeline.start_synth(
            self.ledger, self._log("loadgen"), rate=args.rate, duration=args.duration,
            ips=args.ips, late_fraction=_LATE_FRACTION, late_behind_seconds=_LATE_BEHIND_SECONDS,
            malformed_fraction=0.002, name="the generator",
        ).child  # fmt: skip
        self.procs.append(generator)
        if generator.wait() != 0:
            status = generator.returncode
            _say(f"the generator failed (status {status}); see {self._log('loadgen')}")
            return False
        return True

    def _report(self, verify: subprocess.CompletedProcess[str] | None) -> int:
        """The exactness check's verdict, and the demo's exit status."""
        _say("exactness check against the generator's ground truth:")
        if verify is None:
            _say("no verification ran")
            return 1
        print(verify.stdout.strip(), flush=True)
        if verify.returncode != 0:
            print(verify.stderr.strip(), flush=True)
            return verify.returncode
        left = _open_windows(verify.stdout)
        if left:
            _say(
                f"the job had not emitted {left} (window, ip) results within {self.idle + 60:.0f}s"
            )
            return 1
        _say(f"done in {time.monotonic() - self.began:.0f}s")
        return 0
