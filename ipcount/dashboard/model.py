"""The top-N IPs per window, from final results and late corrections: the one definition that
`ipcount top` and the dashboard both use. Pure (no Kafka); CLI side."""

from __future__ import annotations

import ipaddress
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from ipcount.formats.avro import IpCount

__all__ = ["KINDS", "TopRow", "TopWindow", "WindowBook", "top_rows", "ip_order"]

# What a record is: a window's final count (topics.sink) or a late-count correction (topics.late).
KINDS = ("final", "late")


def ip_order(ip: str) -> tuple[int, int, str]:
    """Sort key for ties: numeric address order, IPv4 before IPv6 (anything else last, by text)."""
    try:
        addr = ipaddress.ip_address(ip)
    except ValueError:
        return (99, 0, ip)
    return (addr.version, int(addr), ip)


@dataclass(frozen=True, slots=True)
class TopRow:
    """One IP of a window's top N: its corrected count, the late part of it, and its share of
    the window's corrected total over all IPs."""

    ip: str
    count: int
    late: int
    share: float


@dataclass(frozen=True, slots=True)
class TopWindow:
    """One window's top N. `total` and `ips` cover every IP of the window, not only the N shown;
    `late` is how much of `total` came as corrections; `final` says whether the window's final
    results were seen (a window only late records reached has none)."""

    window_start: int
    window_end: int
    total: int
    late: int
    ips: int
    final: bool
    rows: tuple[TopRow, ...]

    def to_json(self) -> dict[str, Any]:
        """The form the dashboard's data endpoint and `ipcount top --json` give."""
        return {
            "window_start": self.window_start,
            "window_end": self.window_end,
            "total": self.total,
            "late": self.late,
            "ips": self.ips,
            "final": self.final,
            "top": [
                {"ip": r.ip, "count": r.count, "late": r.late, "share": r.share} for r in self.rows
            ],
        }


def top_rows(final: Mapping[str, int], late: Mapping[str, int], n: int) -> list[TopRow]:
    """The N IPs with the highest corrected count (final + late), ties in address order.

    Raises:
        ValueError: n < 1.
    """
    if n < 1:
        raise ValueError(f"n must be at least 1, got {n}")
    totals = {ip: final.get(ip, 0) + late.get(ip, 0) for ip in {*final, *late}}
    whole = sum(totals.values())
    ranked = sorted(totals.items(), key=lambda kv: (-kv[1], ip_order(kv[0])))[:n]
    return [
        TopRow(ip, count, late.get(ip, 0), count / whole if whole else 0.0) for ip, count in ranked
    ]


@dataclass
class _Window:
    end: int
    final: dict[str, int] = field(default_factory=dict)
    late: dict[str, int] = field(default_factory=dict)
    seq: int = 0


class WindowBook:
    """Per-window counts as read from the sink and late topics, bounded to the newest `keep`
    windows (None: unbounded). Every change bumps `seq`, so a reader can ask what changed."""

    def __init__(self, keep: int | None = None) -> None:
        if keep is not None and keep < 1:
            raise ValueError(f"keep must be at least 1, got {keep}")
        self.keep = keep
        self.seq = 0
        # Records for windows older than the kept ones, not shown: late corrections, and final
        # results too while a backlog of more windows than `keep` is read. In all and by kind.
        self.forgotten = 0
        self.forgotten_by_kind = dict.fromkeys(KINDS, 0)
        self._windows: dict[int, _Window] = {}

    def add(self, result: IpCount, kind: str) -> bool:
        """Apply one record. Returns False when its window is older than every kept window
        and the book is full (it is counted in `forgotten`).

        Raises:
            ValueError: kind is not 'final' or 'late'.
        """
        if kind not in KINDS:
            raise ValueError(f"kind must be one of {', '.join(KINDS)}, got {kind!r}")
        start = result.window_start
        window = self._windows.get(start)
        if window is None:
            if self.keep is not None and len(self._windows) >= self.keep:
                oldest = min(self._windows)
                if start < oldest:
                    self.forgotten += 1
                    self.forgotten_by_kind[kind] += 1
                    return False
                del self._windows[oldest]
            window = self._windows[start] = _Window(result.window_end)
        counts = window.final if kind == "final" else window.late
        counts[result.ip] = counts.get(result.ip, 0) + result.count
        self.seq += 1
        window.seq = self.seq
        return True

    def __len__(self) -> int:
        return len(self._windows)

    def starts(self) -> list[int]:
        """The kept windows' starts, oldest first."""
        return sorted(self._windows)

    def changed_since(self, seq: int) -> list[int]:
        """Starts of the windows changed after `seq` (a past value of `self.seq`), oldest first."""
        return sorted(s for s, w in self._windows.items() if w.seq > seq)

    def window(self, start: int, n: int) -> TopWindow | None:
        """One window's top N, or None if the book does not hold it."""
        w = self._windows.get(start)
        if w is None:
            return None
        rows = top_rows(w.final, w.late, n)
        late = sum(w.late.values())
        return TopWindow(
            window_start=start,
            window_end=w.end,
            total=sum(w.final.values()) + late,
            late=late,
            ips=len({*w.final, *w.late}),
            final=bool(w.final),
            rows=tuple(rows),
        )

    def top(self, n: int) -> list[TopWindow]:
        """Every kept window's top N, in window order."""
        out = []
        for start in self.starts():
            w = self.window(start, n)
            if w is not None:
                out.append(w)
        return out
