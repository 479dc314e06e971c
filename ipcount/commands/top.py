"""`ipcount top`: the top-N IPs of every window in the terminal, from the sink's final results
and the late corrections, read_committed."""

from __future__ import annotations

import argparse
import json
import sys
import time
from typing import Any

from ipcount.config import Settings
from ipcount.dashboard.feed import ResultFeed
from ipcount.dashboard.model import WindowBook
from ipcount.dashboard.text import TopPrinter
from ipcount.errors import BrokerError

__all__ = ["register", "run", "ORDER"]

ORDER = 22

_DESCRIPTION = """\
Print the top-N client IPs of every window: one block per window, in window order, with each
IP's count and its share of the window's total (over all IPs, not only the N shown).

Reads topics.sink (final counts) and topics.late (late-count corrections) with
isolation.level=read_committed, from the beginning. Counts are corrected totals: an IP's count is
its final count plus every correction for its (window, IP) read so far, and a line ending in
"(+K late)" says K of it came as corrections.

A window is printed once its results have arrived: the job writes all of a window's results in
one transaction, and a block is printed only when every partition of both topics has been read to
its end, so no window is shown half-read. Without --follow, top reads both topics to their ends,
prints every window (corrections already added in) and exits. With --follow it then keeps
printing windows as they are committed; a correction that arrives for a window already printed
prints an "update" block: what changed (+K late), the new total and the new ranking. A window
that only late records reached has no final result; its block says so."""


def register(sub: Any) -> None:
    p = sub.add_parser(
        "top",
        help="the top-N IPs of every window (corrected by late records), in the terminal",
        description=_DESCRIPTION,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--n", type=int, default=10, help="IPs per window (default 10)")
    p.add_argument(
        "--follow", action="store_true", help="keep printing windows as they are committed"
    )
    p.add_argument(
        "--json",
        action="store_true",
        help="one JSON object per window block (update: true for a correction's block)",
    )
    p.add_argument(
        "--no-late",
        action="store_true",
        help="ignore topics.late: final counts only (for a job with job.late_corrections off)",
    )
    p.add_argument(
        "--keep",
        type=int,
        default=720,
        metavar="K",
        help="with --follow: remember the newest K windows for corrections (default 720, one "
        "hour of 5 s windows); a correction for an older window is counted, not shown",
    )
    p.add_argument(
        "--idle-exit",
        type=float,
        default=None,
        metavar="SECONDS",
        help="with --follow: exit after this long without new results (default: until Ctrl-C)",
    )
    p.set_defaults(func=run)


def _check(args: argparse.Namespace) -> None:
    if args.n < 1:
        raise SystemExit("ipcount top: error: --n must be at least 1")
    if args.keep < 1:
        raise SystemExit("ipcount top: error: --keep must be at least 1")


def run(args: argparse.Namespace, settings: Settings) -> int:
    _check(args)
    printer = TopPrinter(args.n)
    book = WindowBook(keep=args.keep if args.follow else None)
    forgotten = 0

    def emit() -> None:
        nonlocal forgotten
        if args.json:
            for record in printer.records(book):
                print(json.dumps(record), flush=True)
        else:
            for line in printer.lines(book):
                print(line, flush=True)
        if book.forgotten > forgotten:
            print(
                f"note: {book.forgotten - forgotten} correction(s) for windows older than the "
                f"newest {args.keep} were not shown (raise --keep)",
                file=sys.stderr,
                flush=True,
            )
            forgotten = book.forgotten

    with ResultFeed(settings, with_late=not args.no_late) as feed:
        feed.read_to_end(book)
        emit()
        if not args.follow:
            return 0
        try:
            _follow(args, feed, book, emit)
        except KeyboardInterrupt:
            pass
    return 0


def _follow(args: argparse.Namespace, feed: ResultFeed, book: WindowBook, emit: Any) -> None:
    broken: str | None = None
    seen, last = book.seq, time.monotonic()
    while True:
        try:
            caught_up = feed.step(book)
        except BrokerError as exc:
            if str(exc) != broken:
                print(f"ipcount top: {exc} (retrying)", file=sys.stderr, flush=True)
                broken = str(exc)
            time.sleep(1)
            continue
        broken = None
        if caught_up:
            emit()
        now = time.monotonic()
        if book.seq != seen:
            seen, last = book.seq, now
        elif args.idle_exit is not None and now - last >= args.idle_exit:
            return
