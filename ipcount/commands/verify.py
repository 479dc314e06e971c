"""`ipcount verify`: read the whole sink topic (and the late corrections) and check it exactly
against ground-truth ledgers; windows the job still holds open are reported apart from losses."""

from __future__ import annotations

import argparse

from ipcount.commands import SubParsers
from ipcount.config import Settings
from ipcount.verify.compare import verify_sink
from ipcount.verify.ledger import Ledger
from ipcount.verify.watermark import sink_watermark

__all__ = ["register", "run"]


def register(sub: SubParsers) -> None:
    p = sub.add_parser(
        "verify",
        help="check the sink topic against loadgen ledgers (exit 0 only if exact)",
        description="Read topics.sink from the beginning to its end (read_committed) and compare "
        "each (window, ip) result with the merged ledgers: missing, duplicate and wrong results "
        "are reported. With job.late_corrections (the default) topics.late is read too, and each "
        "(window, ip)'s final count plus its corrections must equal the ledger's total, late "
        "records included. A window with no result that ends after the job's watermark (read "
        "from the sink's progress markers, else from the checkpoint) is open, not yet emitted: "
        "counted as open=, not missing=, and it does not make the run inexact. The last line "
        "ends with 'open=O results=N missing=M duplicates=D wrong=W exact=true|false'.",
    )
    p.add_argument(
        "--without-late",
        action="store_true",
        help="ignore topics.late and judge late windows by the old rule (a job that ran with "
        "job.late_corrections = false)",
    )
    p.add_argument(
        "--ledger",
        action="append",
        required=True,
        metavar="FILE",
        help="ledger file (repeatable; merged)",
    )
    p.add_argument(
        "--read-uncommitted",
        action="store_true",
        help="judge what a read_uncommitted reader sees (aborted transactions show as duplicates)",
    )
    p.add_argument(
        "--checkpoint",
        metavar="DIR",
        help="the counting query's checkpoint, read for the watermark only when the sink's "
        "progress markers record none (older ipcount); default job.checkpoint_location",
    )
    p.add_argument(
        "--timeout",
        type=float,
        default=120.0,
        metavar="SECONDS",
        help="how long to wait for the topic's end to become readable (default 120)",
    )
    p.set_defaults(func=run)


def run(args: argparse.Namespace, settings: Settings) -> int:
    ledger = Ledger.load_all(args.ledger)
    isolation = "read_uncommitted" if args.read_uncommitted else "read_committed"
    with_late = False if args.without_late else None
    # Before the sink: every window this watermark closes is then in what is read after it.
    watermark, unknown = sink_watermark(settings, args.checkpoint, args.timeout)
    report = verify_sink(
        settings, ledger, isolation, args.timeout, with_late=with_late, watermark=watermark
    )
    for line in report.examples:
        print(line)
    if report.total_examples > len(report.examples):
        print(f"... and {report.total_examples - len(report.examples)} more")
    if watermark is None:
        print(f"watermark unknown: {unknown}; windows the job still holds open count as missing")
    hint = report.open_hint()
    if hint:
        print(hint)
    print(report.summary(), flush=True)
    return 0 if report.exact else 1
