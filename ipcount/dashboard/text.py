"""`ipcount top`'s output: one block per window (a header line, then one line per top IP), and per
refresh one compact corrections block for earlier windows that late records changed. CLI side."""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping
from typing import Any

from ipcount.dashboard.model import TopWindow, WindowBook

__all__ = ["TopPrinter", "format_block", "format_corrections", "count_forgotten"]

_IP_WIDTH = 15  # an IPv4 address; longer (IPv6) addresses widen the column of their block
_COUNT_WIDTH = 5


def _utc(ms: int) -> dt.datetime:
    return dt.datetime.fromtimestamp(ms / 1000, tz=dt.UTC)


def _span(w: TopWindow) -> str:
    seconds = (w.window_end - w.window_start) / 1000
    return f"{_utc(w.window_start).strftime('%Y-%m-%dT%H:%M:%SZ')} +{seconds:g}s"


def count_forgotten(by_kind: Mapping[str, int]) -> str:
    """Records not shown, in words by kind: "2 final results and 1 late correction"."""
    names = {
        "final": ("final result", "final results"),
        "late": ("late correction", "late corrections"),
    }
    parts = [f"{n} {names[k][n != 1]}" for k, n in by_kind.items() if n]
    return " and ".join(parts) or "no records"


def format_block(w: TopWindow, shown: TopWindow | None = None) -> list[str]:
    """The lines for one window: a `window` header the first time, an `update` header saying
    what changed since `shown` (the state printed before) afterwards, then its top N."""
    if shown is None:
        head = f"window {_span(w)}  {w.total} requests from {w.ips} IPs"
        if w.late:
            head += f", {w.late} of them late"
        if not w.final:
            head += " (no final result: every record came late)"
    else:
        changes = []
        if w.late != shown.late:
            changes.append(f"+{w.late - shown.late} late")
        other = (w.total - w.late) - (shown.total - shown.late)
        if other:
            changes.append(f"+{other} in more final results")
        head = (
            f"update {_span(w)}  {', '.join(changes) or 'changed'}: "
            f"{w.total} requests from {w.ips} IPs (was {shown.total})"
        )
    ip_width = max([_IP_WIDTH, *(len(r.ip) for r in w.rows)])
    count_width = max([_COUNT_WIDTH, *(len(str(r.count)) for r in w.rows)])
    when = _utc(w.window_start).strftime("%H:%M:%SZ")
    lines = [head]
    for r in w.rows:
        line = f"{when}  {r.ip:<{ip_width}}  {r.count:>{count_width}}  {r.share * 100:5.1f}%"
        if r.late:
            line += f"  (+{r.late} late)"
        lines.append(line)
    return lines


def format_corrections(changed: list[tuple[TopWindow, TopWindow | None]]) -> list[str]:
    """One block for the earlier windows late records changed: what changed in each, one line
    per window (the ranking is not repeated; `--json` gives it)."""
    late = sum(w.late - (shown.late if shown else 0) for w, shown in changed)
    n = len(changed)
    records, windows = "record" + "s" * (late != 1), "window" + "s" * (n != 1)
    lines = [f"corrections  {late} late {records} for {n} earlier {windows}:"]
    for w, shown in changed:
        changes = [f"+{w.late - (shown.late if shown else 0)} late"]
        other = (w.total - w.late) - ((shown.total - shown.late) if shown else 0)
        if other:
            changes.append(f"+{other} in more final results")
        now = f"{w.total} requests from {w.ips} IPs"
        was = f"(was {shown.total})" if shown else "(no final result: every record came late)"
        length = (w.window_end - w.window_start) / 1000
        span = f"{_utc(w.window_start).strftime('%H:%M:%SZ')} +{length:g}s"
        lines.append(f"  {span}  {', '.join(changes)}: {now} {was}")
    return lines


class TopPrinter:
    """Turns a WindowBook's changes into output, each window once in window order, then an
    update whenever a shown window changes. Remembers only windows the book still holds."""

    def __init__(self, n: int) -> None:
        if n < 1:
            raise ValueError(f"--n must be at least 1, got {n}")
        self.n = n
        self._seq = 0
        self._shown: dict[int, TopWindow] = {}

    def _changes(self, book: WindowBook) -> list[tuple[TopWindow, TopWindow | None]]:
        out = []
        for start in book.changed_since(self._seq):
            w = book.window(start, self.n)
            if w is not None:
                out.append((w, self._shown.get(start)))
                self._shown[start] = w
        self._seq = book.seq
        kept = set(book.starts())
        for start in [s for s in self._shown if s not in kept]:
            del self._shown[start]
        return out

    def lines(self, book: WindowBook) -> list[str]:
        """Text lines for what changed since the last call: new windows as blocks, in window
        order; then one corrections block for windows shown before that changed, and for
        windows only late records reached that are older than one already shown."""
        newest = max(self._shown, default=None)
        blocks: list[str] = []
        corrected: list[tuple[TopWindow, TopWindow | None]] = []
        for w, shown in self._changes(book):
            older = newest is not None and w.window_start < newest and not w.final
            if shown is None and not older:
                blocks += format_block(w)
            else:
                corrected.append((w, shown))
        return blocks + (format_corrections(corrected) if corrected else [])

    def records(self, book: WindowBook) -> list[dict[str, Any]]:
        """JSON objects for what changed since the last call (`update`: shown before)."""
        return [{**w.to_json(), "update": shown is not None} for w, shown in self._changes(book)]
