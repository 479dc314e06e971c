"""`ipcount soak`: run the live job for a long time at a steady rate, restarting it every few
minutes, and report per interval what must stay flat in its age; verify exactly at the end."""

from __future__ import annotations

import argparse

from ipcount.commands import SubParsers, add_local_run_options, add_options_command, options_from
from ipcount.config import Settings

__all__ = ["register", "run"]


_HELP = "run the job for a long time with periodic restarts; report figures per interval"

_DESCRIPTION = """\
Start a local broker (or use the configured one), fresh topics, `loadgen synth` at --rate records
per second for --duration seconds, and the Spark job (with its metrics endpoint). Every
--restart-every seconds stop the job, SIGTERM and SIGKILL in turn, and start it again from its
checkpoint (a restart waits for the running job's first committed batch). Every --report-every
seconds print one line: batches committed, each restart's time to its first committed batch, the
checkpoint's bytes and files, the offset and commit log entries, the state store's files, changelogs
and snapshots, the job's driver and Python worker memory (RSS), open file descriptors, the progress
topic's records and /healthz. These must stay flat in the job's age. At the end every count is
verified against the generator's ledger (read_committed). Global --set options apply to the job.
Exit 0 only if exact and the job never exited on its own."""


def register(sub: SubParsers) -> None:
    p, add = add_options_command(sub, "soak", run, _HELP, _DESCRIPTION)
    add("--duration", "duration_seconds", float, "seconds of traffic (600)")
    add("--rate", "rate", float, "records per second (2000)")
    add(
        "--restart-every", "restart_every_seconds", float, "seconds between restarts (600; 0: none)"
    )
    add("--report-every", "report_every_seconds", float, "seconds per line (600)")
    add("--ips", "ips", int, "distinct client IPs (2000)")
    add("--seed", "seed", int, "seed of the generated data (1)")
    add("--trigger-interval", "trigger_interval_seconds", float, "job.trigger_interval_seconds (1)")
    add_local_run_options(p, "soak", "soak", "logs, ledger, checkpoint, samples.jsonl")


def _say(text: str) -> None:
    print(f"[soak] {text}", flush=True)


def run(args: argparse.Namespace, settings: Settings) -> int:
    from ipcount.soak.runner import SoakOptions, SoakRunner

    options = options_from(args, SoakOptions, sets=tuple(getattr(args, "overrides", ()) or ()))
    report = SoakRunner(
        settings, options, on_note=_say, on_sample=lambda s: _say(f"sample {s.line()}")
    ).run()
    for why in report.unplanned_exits:
        _say(f"unplanned: {why}")
    summary = report.verify.summary() if report.verify is not None else "not verified"
    _say(f"records={report.records} seconds={report.seconds:.0f} samples={len(report.samples)}")
    print(f"soak: {summary} unplanned_exits={len(report.unplanned_exits)}", flush=True)
    return 0 if report.exact else 1
