"""`ipcount top`: the top-N IPs of every window in the terminal, from the sink's final results
and the late corrections, read_committed."""

from __future__ import annotations

import argparse
import json
import sys
import time
from typing import Any

from ipcount.commands import SubParsers, add_no_late_option
from ipcount.config import Settings
from ipcount.dashboard.feed import ResultFeed
from ipcount.dashboard.model import WindowBook
from ipcount.dashboard.text import TopPrinter, count_forgotten
from ipcount.errors import BrokerError

__all__ = ["register", "run"]


_KEEP = 720  # --keep's default
# Without a record or a moved position for this long while behind, reading has stalled.
_STALL_SECONDS = 30.0

_DESCRIPTION = """\
Print the top-N client IPs of every window: one block per window, in window order, with each
IP's count and its share of the window's total (over all IPs, not only the N shown).

Reads topics.sink (final counts) and topics.late (late-count corrections) with
isolation.level=read_committed, from the beginning. Counts are corrected totals: an IP's count is
its final count plus every correction for its (window, IP) read so far, and a line ending in
"(+K late)" says K of it came as corrections.

A window is printed once its results have arrived: each sink task writes its share of a window's
results in one transaction, and top prints only up to a transaction boundary on every partition of
both topics (their last stable offsets, taken when no commit is half-way through landing), once
everything below it has been read, and a window only once the job's progress marker
(topics.progress) says every share of it is in, so no window is shown half-read; under sustained
load each commit is printed within about a second, without waiting for the topics to go idle.
Without --follow, top reads both topics to their ends (however long they are, as long as records
keep coming), prints every window (corrections already added in) and exits; --last K prints only the
newest K windows and holds no more than K in memory. With --follow it then keeps printing windows as
they are committed; corrections that arrive for windows already printed are gathered into one
compact "corrections" block per refresh: one line per window with what changed (+K late) and its new
total (--json gives the new ranking). A window that only late records reached has no final result;
its block says so (with --follow, one older than a window already printed is a corrections line)."""


def register(sub: SubParsers) -> None:
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
        help="one JSON object per window (update: true for a window printed before)",
    )
    add_no_late_option(p)
    p.add_argument(
        "--last",
        type=int,
        default=None,
        metavar="K",
        help="only the newest K windows: print and keep in memory no more than K (default: "
        "every window; with --follow, --keep's default); with --follow, they are also the "
        "windows kept for corrections",
    )
    p.add_argument(
        "--keep",
        type=int,
        default=None,
        metavar="K",
        help=f"with --follow: remember the newest K windows for corrections (default {_KEEP}, "
        "one hour of 5 s windows); a correction for an older window is counted, not shown",
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
    if args.keep is not None and args.keep < 1:
        raise SystemExit("ipcount top: error: --keep must be at least 1")
    if args.last is not None and args.last < 1:
        raise SystemExit("ipcount top: error: --last must be at least 1")
    if args.last is not None and args.keep is not None:
        raise SystemExit(
            "ipcount top: error: --last and --keep both set how many windows are kept: give one"
        )


def run(args: argparse.Namespace, settings: Settings) -> int:
    _check(args)
    printer = TopPrinter(args.n)
    if args.last is not None:
        keep: int | None = args.last
    else:
        keep = (args.keep or _KEEP) if args.follow else None
    book = WindowBook(keep=keep)
    option = "--keep" if args.last is None else "--last"
    noted: dict[str, int] | None = None  # what the notes covered; None: nothing emitted yet

    def emit() -> None:
        nonlocal noted
        if args.json:
            for record in printer.records(book):
                print(json.dumps(record), flush=True)
        else:
            for line in printer.lines(book):
                print(line, flush=True)
        new = {k: n - (noted or {}).get(k, 0) for k, n in book.forgotten_by_kind.items()}
        # Reading the backlog, results of windows older than the kept ones are expected and
        # --last asked for that; after it, a correction (or result) came for a window let go.
        if any(new.values()) and (noted is not None or args.last is None):
            verb = "was" if sum(new.values()) == 1 else "were"
            what = "not shown" if noted is not None else "skipped while reading the backlog"
            print(
                f"note: {count_forgotten(new)} for windows older than the newest {keep} {verb} "
                f"{what} (raise {option} to keep more)",
                file=sys.stderr,
                flush=True,
            )
        noted = dict(book.forgotten_by_kind)

    with ResultFeed(settings, with_late=not args.no_late) as feed:
        # Up to a cut taken after the start: every transaction committed before it, in full.
        feed.catch_up(book, stall_seconds=_STALL_SECONDS)
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
            at_cut = feed.step(book)
        except BrokerError as exc:
            if str(exc) != broken:
                print(f"ipcount top: {exc} (retrying)", file=sys.stderr, flush=True)
                broken = str(exc)
            time.sleep(1)
            continue
        broken = None
        if at_cut:
            emit()
        now = time.monotonic()
        if book.seq != seen:
            seen, last = book.seq, now
        elif args.idle_exit is not None and now - last >= args.idle_exit:
            return
