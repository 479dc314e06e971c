"""`ipcount demo`: the whole pipeline on this machine — broker, topics, generator, job, consumer,
verify."""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from ipcount.config import Settings
from ipcount.kafka.topics import ensure_topics
from ipcount.local.broker import free_port
from ipcount.local.kinds import configured_broker

__all__ = ["register", "ORDER"]

ORDER = 5

_BROKER_NAMES = {
    "kafka": "a local Apache Kafka broker (KRaft, one node; broker.kind = kafka)",
    "noida-db": "a local noida-db broker (the JVM-free stand-in; broker.kind = noida-db)",
}


def register(sub: Any) -> None:
    p = sub.add_parser(
        "demo",
        help="run the whole pipeline locally and print the top IPs per window",
        description="Start a fresh local broker, create the topics, generate access records, "
        "run the Spark job, print each window's top IPs as its read_committed results are "
        "committed (`ipcount top --follow`), then verify every count against the generator's "
        "ground truth.",
    )
    p.add_argument("--dir", default=".ipcount/demo", help="working directory (wiped first)")
    p.add_argument("--rate", type=int, default=2000, help="records per second (default 2000)")
    p.add_argument("--duration", type=float, default=20.0, help="seconds of traffic (default 20)")
    p.add_argument("--ips", type=int, default=20, help="distinct client IPs (default 20)")
    p.add_argument("--top", type=int, default=5, help="IPs shown per window (default 5)")
    p.add_argument("--keep-broker", action="store_true", help="leave the broker running at the end")
    p.set_defaults(func=run)


def _say(msg: str) -> None:
    print(f"[demo] {msg}", flush=True)


def _spawn(cmd: list[str], env: dict[str, str], log: Path | None) -> subprocess.Popen[bytes]:
    out: Any = open(log, "ab") if log else None  # noqa: SIM115 - handed to the child
    try:
        return subprocess.Popen(cmd, env=env, stdout=out, stderr=subprocess.STDOUT if out else None)
    finally:
        if out:
            out.close()


def run(args: argparse.Namespace, settings: Settings) -> int:
    work = Path(args.dir).resolve()
    if work.exists():
        shutil.rmtree(work)
    work.mkdir(parents=True)
    broker = configured_broker(settings, work / "broker", free_port())
    what = _BROKER_NAMES.get(broker.kind, broker.kind)
    _say(f"starting {what} on {broker.bootstrap}, data in {broker.data_dir}")
    broker.start(timeout=settings.broker.start_timeout_seconds)
    ledger = work / "ledger.jsonl"
    checkpoint = work / "checkpoint"
    overrides = [
        f"kafka.bootstrap_servers={broker.bootstrap}",
        f"job.checkpoint_location={checkpoint}",
    ]
    env = {**os.environ, "PYSPARK_PYTHON": sys.executable, "IPCOUNT_CONFIG": settings.source_path}
    if settings.source_path == "defaults":
        env.pop("IPCOUNT_CONFIG")
    sets = [arg for o in overrides for arg in ("--set", o)]
    procs: list[subprocess.Popen[bytes]] = []
    try:
        demo_settings = settings.replace("kafka", bootstrap_servers=broker.bootstrap)
        for name, state in ensure_topics(demo_settings).items():
            _say(f"topic {name}: {state}")
        ipcount = [sys.executable, "-m", "ipcount"]
        _say(f"starting the Spark job (log: {work / 'job.log'})")
        job = _spawn([*ipcount, *sets, "run"], env, work / "job.log")
        procs.append(job)
        _say(
            f"generating {args.rate} records/s for {args.duration:g}s from {args.ips} IPs "
            f"(log: {work / 'loadgen.log'}, ground truth: {ledger})"
        )
        synth = _spawn(
            [
                sys.executable,
                "-m",
                "loadgen",
                *sets,
                "synth",
                "--rate",
                str(args.rate),
                "--duration",
                str(args.duration),
                "--ips",
                str(args.ips),
                "--late-fraction",
                "0.001",
                "--malformed-fraction",
                "0.002",
                "--ledger",
                str(ledger),
            ],
            env,
            work / "loadgen.log",
        )
        procs.append(synth)
        window = settings.job.window_seconds
        idle = (
            settings.job.idle_timeout_seconds + window + settings.job.watermark_delay_seconds + 10
        )
        _say(
            f"the top {args.top} IPs of each window, as its read_committed results are committed "
            "(ipcount top --follow; late corrections show as update blocks):"
        )
        consumer = _spawn(
            [
                *ipcount,
                *sets,
                "top",
                "--follow",
                "--n",
                str(args.top),
                "--idle-exit",
                f"{args.duration + idle + 60:g}",
            ],
            env,
            None,
        )
        procs.append(consumer)
        if synth.wait() != 0:
            _say(f"the generator failed (status {synth.returncode}); see {work / 'loadgen.log'}")
            return 1
        _say(
            f"traffic done; waiting for the last windows "
            f"(about {idle:.0f}s: idle timeout + window + delay)"
        )
        deadline = time.monotonic() + idle + 60
        verify: subprocess.CompletedProcess[str] | None = None
        while time.monotonic() < deadline and job.poll() is None:
            verify = subprocess.run(
                [*ipcount, *sets, "verify", "--ledger", str(ledger)],
                env=env,
                capture_output=True,
                text=True,
            )
            if verify.returncode == 0:
                break
            time.sleep(3)
        if job.poll() is not None:
            _say(f"the job stopped unexpectedly (status {job.returncode}); see {work / 'job.log'}")
            return 1
        try:
            # top prints a window once it has read all of it: a moment for the last ones.
            consumer.wait(timeout=4)
        except subprocess.TimeoutExpired:
            consumer.send_signal(signal.SIGINT)
            consumer.wait(timeout=30)
        _say("stopping the job (SIGTERM: it finishes its current micro-batch)")
        job.send_signal(signal.SIGTERM)
        job.wait(timeout=120)
        _say("exactness check against the generator's ground truth:")
        if verify is None:
            _say("no verification ran")
            return 1
        print(verify.stdout.strip(), flush=True)
        if verify.returncode != 0:
            print(verify.stderr.strip(), flush=True)
        return verify.returncode
    finally:
        for p in procs:
            if p.poll() is None:
                p.terminate()
                try:
                    p.wait(timeout=60)
                except subprocess.TimeoutExpired:
                    p.kill()
        if args.keep_broker:
            _say(f"broker left running on {broker.bootstrap} (pid in {broker.state_file})")
        else:
            broker.stop()
            _say("broker stopped")
