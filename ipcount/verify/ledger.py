"""Ground-truth ledger of expected per-(window, IP) counts, written by loadgen and read by `ipcount
verify` (JSON lines; see `Ledger`)."""

from __future__ import annotations

import json
import os
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

from ipcount.errors import ConfigError
from ipcount.formats.accesslog import canonical_ip

__all__ = ["Ledger", "window_start_ms"]

_MAGIC = "ipcount"
_VERSION = 1


def window_start_ms(event_ms: int, window_ms: int) -> int:
    """The start of the tumbling window [start, start + window_ms) that holds event_ms."""
    return event_ms - event_ms % window_ms


@dataclass
class Ledger:
    """Expected counts per (window_start_ms, ip), plus tallies of records expected to be dropped.

    File format (JSON lines, one file per producer run; several files may be merged):
        {"ledger": "ipcount", "version": 1, "window_ms": 5000,
         "records": N, "on_time": N, "late": N, "malformed": N}
        {"window_start": <epoch ms>, "ip": "<ip>", "count": <on-time n>, "late": <late n>}
        ...
    Windows are tumbling and aligned to the epoch: window_start = event_ms - event_ms % window_ms.
    "late" records were produced deliberately behind the watermark, in windows that hold no
    on-time records. Spark drops them if its watermark has passed when they are read; if it has
    not (e.g. they fall in the very first micro-batch), their window is emitted with at most the
    late count. `verify` judges on-time windows strictly and late windows by that rule.
    """

    window_ms: int = 5000
    counts: Counter[tuple[int, str]] = field(default_factory=Counter)
    late_counts: Counter[tuple[int, str]] = field(default_factory=Counter)
    malformed: int = 0

    def add(self, event_ms: int, ip: str, n: int = 1) -> None:
        """Record n on-time records of `ip` at `event_ms`."""
        self.counts[(window_start_ms(event_ms, self.window_ms), canonical_ip(ip))] += n

    def add_late(self, event_ms: int, ip: str, n: int = 1) -> None:
        """Record n records of `ip` produced deliberately behind the watermark at `event_ms`."""
        self.late_counts[(window_start_ms(event_ms, self.window_ms), canonical_ip(ip))] += n

    def add_malformed(self, n: int = 1) -> None:
        """Record n malformed records (never counted in any window)."""
        self.malformed += n

    @property
    def late(self) -> int:
        return sum(self.late_counts.values())

    @property
    def on_time(self) -> int:
        return sum(self.counts.values())

    @property
    def records(self) -> int:
        return self.on_time + self.late + self.malformed

    def merge(self, other: Ledger) -> None:
        """Add another ledger's counts and tallies to this one (same window length)."""
        if other.window_ms != self.window_ms:
            raise ConfigError(
                f"cannot merge ledgers with window_ms {self.window_ms} and {other.window_ms}"
            )
        self.counts.update(other.counts)
        self.late_counts.update(other.late_counts)
        self.malformed += other.malformed

    def save(self, path: str | Path) -> None:
        """Write atomically (tmp file + rename), so a reader never sees half a ledger."""
        target = Path(path)
        target.parent.mkdir(parents=True, exist_ok=True)
        tmp = target.with_name(f".{target.name}.{os.getpid()}.tmp")
        with open(tmp, "w", encoding="utf-8") as fh:
            header = {
                "ledger": _MAGIC,
                "version": _VERSION,
                "window_ms": self.window_ms,
                "records": self.records,
                "on_time": self.on_time,
                "late": self.late,
                "malformed": self.malformed,
            }
            fh.write(json.dumps(header) + "\n")
            for key in sorted(set(self.counts) | set(self.late_counts)):
                row: dict[str, int | str] = {"window_start": key[0], "ip": key[1]}
                if self.counts.get(key):
                    row["count"] = self.counts[key]
                if self.late_counts.get(key):
                    row["late"] = self.late_counts[key]
                fh.write(json.dumps(row) + "\n")
        os.replace(tmp, target)

    @classmethod
    def load(cls, path: str | Path) -> Ledger:
        """Read one ledger file.

        Raises:
            ConfigError: the file is missing or not a ledger (names the file and line).
        """
        p = Path(path)
        try:
            lines = p.read_text(encoding="utf-8").splitlines()
        except FileNotFoundError:
            raise ConfigError(f"ledger file {p} does not exist") from None
        if not lines:
            raise ConfigError(f"ledger file {p} is empty")
        try:
            header = json.loads(lines[0])
        except json.JSONDecodeError:
            header = None
        if not isinstance(header, dict) or header.get("ledger") != _MAGIC:
            raise ConfigError(f"{p} is not an ipcount ledger (first line must be its header)")
        if header.get("version") != _VERSION:
            raise ConfigError(f"{p}: unsupported ledger version {header.get('version')!r}")
        ledger = cls(window_ms=int(header["window_ms"]), malformed=int(header.get("malformed", 0)))
        for lineno, line in enumerate(lines[1:], start=2):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
                key = (int(row["window_start"]), str(row["ip"]))
                if row.get("count"):
                    ledger.counts[key] += int(row["count"])
                if row.get("late"):
                    ledger.late_counts[key] += int(row["late"])
            except (json.JSONDecodeError, KeyError, TypeError, ValueError) as exc:
                raise ConfigError(f"{p}:{lineno}: bad ledger row ({exc})") from None
        return ledger

    @classmethod
    def load_all(cls, paths: Iterable[str | Path]) -> Ledger:
        """Read and merge several ledger files."""
        merged: Ledger | None = None
        for path in paths:
            one = cls.load(path)
            if merged is None:
                merged = one
            else:
                merged.merge(one)
        if merged is None:
            raise ConfigError("no ledger file given")
        return merged
