"""`ipcount soak`: run the live job for a long time at a steady rate, restarting it every few
minutes, and report per interval what must stay flat in its age; verify exactly at the end."""

from __future__ import annotations

import argparse

from ipcount.commands import SubParsers, add_local_run_options
from ipcount.config import Settings

__all__ = ["register", "run"]


_DESCRIPTION = (
    "Start a local broker (or use the configured one), fresh topics, `loadgen synth` at --rate "
    "records per second for --duration seconds, and the Spark job (with its metrics endpoint). "
    "Every --restart-every seconds stop the job, SIGTERM and SIGKILL in turn, and start it again "
    "from its checkpoint. Every --report-every seconds print one line: batches committed, each "
    "restart's time to its first committed batch, the checkpoint's bytes and files, the offset "
    "and commit log entries, the state store's files, changelogs and snapshots, the job's "
    "driver and Python worker memory (RSS), open file descriptors, the progress topic's records "
    "and /healthz. These must stay flat in the job's age. At the end every count is verified "
    "against the generator's ledger (read_committed). Global --set options apply to the job. "
    "Exit 0 only if exact and the job never exited on its own."
)


def register(sub: SubParsers) -> None:
    p = sub.add_parser(
        "soak",
        help="run the job for a long time with periodic restarts; report figures per interval",
        description=_DESCRIPTION,
    )
    p.add_argument("--duration", type=float, default=600.0, help="seconds of traffic (600)")
    p.add_argument("--rate", type=float, default=2000.0, help="records per second (2000)")
    p.add_argument(
        "--restart-every", type=float, default=600.0, help="seconds between restarts (600; 0: none)"
    )
    p.add_argument("--report-every", type=float, default=600.0, help="seconds per line (600)")
    p.add_argument("--ips", type=int, default=2000, help="distinct client IPs (2000)")
    p.add_argument("--seed", type=int, default=1, help="seed of the generated data (1)")
    p.add_argument(
        "--trigger-interval", type=float, default=1.0, help="job.trigger_interval_seconds (1)"
    )
    add_local_run_options(p, "soak", "soak", "logs, ledger, checkpoint, samples.jsonl")
    p.set_defaults(func=run)


def _say(text: str) -> None:
    print(f"[soak] {text}", flush=True)


def run(args: argparse.Namespace, settings: Settings) -> int:
    from ipcount.soak.runner import SoakOptions, SoakRunner

    options = SoakOptions(
        work_dir=args.work_dir,
        duration_seconds=args.duration,
        rate=args.rate,
        restart_every_seconds=args.restart_every,
        report_every_seconds=args.report_every,
        ips=args.ips,
        seed=args.seed,
        use_configured_broker=args.use_configured_broker,
        trigger_interval_seconds=args.trigger_interval,
        sets=tuple(getattr(args, "overrides", ()) or ()),
    )
    report = SoakRunner(
        settings, options, on_note=_say, on_sample=lambda s: _say(f"sample {s.line()}")
    ).run()
    for why in report.unplanned_exits:
        _say(f"unplanned: {why}")
    summary = report.verify.summary() if report.verify is not None else "not verified"
    _say(f"records={report.records} seconds={report.seconds:.0f} samples={len(report.samples)}")
    print(f"soak: {summary} unplanned_exits={len(report.unplanned_exits)}", flush=True)
    return 0 if report.exact else 1
