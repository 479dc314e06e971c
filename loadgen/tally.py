"""Ledger bookkeeping for `loadgen synth` (pure, no I/O): delivered records are tallied per
(window, IP) in numpy arrays and turned into an ipcount Ledger at the end. Runs in loadgen.
"""

from __future__ import annotations

from collections import Counter

import numpy as np

from ipcount.verify.ledger import Ledger, window_start_ms
from loadgen.generator import KIND_LATE, KIND_MALFORMED, KIND_ON_TIME, Batch

__all__ = ["LedgerTally"]


class LedgerTally:
    """Delivered-record counts kept as numpy arrays until the ledger is built (cheap per batch)."""

    def __init__(self, ips: list[str], window_ms: int) -> None:
        self.ips = ips
        self.window_ms = window_ms
        self._parts: dict[int, list[tuple[np.ndarray, np.ndarray]]] = {
            KIND_ON_TIME: [],
            KIND_LATE: [],
        }
        self.malformed = 0
        self.malformed_kinds: Counter[str] = Counter()
        self.on_time = 0
        self.late = 0
        # (kind, timestamp_ms, key) of records counted by add() whose delivery then failed.
        self._failed: list[tuple[int, int, bytes | None]] = []

    def add(self, batch: Batch) -> None:
        """Count every record of a batch whose delivery reports have all arrived."""
        for kind in (KIND_ON_TIME, KIND_LATE):
            mask = batch.kinds == kind
            n = int(mask.sum())
            if not n:
                continue
            keys = (batch.event_ms[mask] // self.window_ms) * len(self.ips) + batch.ip_idx[mask]
            uniq, cnt = np.unique(keys, return_counts=True)
            parts = self._parts[kind]
            parts.append((uniq, cnt))
            if len(parts) >= 64:
                parts[:] = [_combine(parts)]
            if kind == KIND_ON_TIME:
                self.on_time += n
            else:
                self.late += n
        self.malformed += len(batch.malformed)
        self.malformed_kinds.update(batch.malformed.values())

    def remove(
        self, kind: int, timestamp_ms: int, key: bytes | None, malformed_kind: str | None = None
    ) -> None:
        """Take back one record counted by add() whose delivery failed."""
        self._failed.append((kind, timestamp_ms, key))
        if kind == KIND_ON_TIME:
            self.on_time -= 1
        elif kind == KIND_LATE:
            self.late -= 1
        else:
            self.malformed -= 1
            if malformed_kind is not None:
                self.malformed_kinds[malformed_kind] -= 1

    def to_ledger(self) -> Ledger:
        """The ground-truth ledger of everything counted."""
        ledger = Ledger(window_ms=self.window_ms)
        p, w = len(self.ips), self.window_ms
        for kind, target in ((KIND_ON_TIME, ledger.counts), (KIND_LATE, ledger.late_counts)):
            if not self._parts[kind]:
                continue
            uniq, cnt = _combine(self._parts[kind])
            for k, c in zip(uniq.tolist(), cnt.tolist(), strict=True):
                target[((k // p) * w, self.ips[k % p])] += c
        ledger.malformed = self.malformed
        for kind, ts, key in self._failed:
            if kind == KIND_MALFORMED or key is None:
                continue
            target = ledger.counts if kind == KIND_ON_TIME else ledger.late_counts
            slot = (window_start_ms(ts, w), key.decode("ascii").lower())
            target[slot] -= 1
            if target[slot] <= 0:
                del target[slot]
        return ledger


def _combine(parts: list[tuple[np.ndarray, np.ndarray]]) -> tuple[np.ndarray, np.ndarray]:
    keys = np.concatenate([k for k, _ in parts])
    counts = np.concatenate([c for _, c in parts])
    uniq, inverse = np.unique(keys, return_inverse=True)
    return uniq, np.bincount(inverse, weights=counts).astype(np.int64)
