"""The nginx combined-format parse, vectorised over an Arrow array of raw records: what the job's
read tasks run before they combine counts.

The same truth as `accesslog.parse_record`, by construction: the line grammar is the same pattern
(`LINE_PATTERN_RE2`, RE2's spelling of `LINE_PATTERN`), and each *distinct* client IP and
`$time_local` text of a chunk goes through the very functions the Python parser uses
(`client_ip`, `parse_time_local`), so no second IP or time rule exists. A chunk of a Kafka
partition holds few distinct seconds and IPs, so those Python calls are a small part of the work;
the per-line work (UTF-8 check, length, regex) is Arrow's C++.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from ipcount.formats.accesslog import LINE_PATTERN_RE2, ParseError, client_ip, parse_time_local

__all__ = [
    "OK",
    "NO_VALUE",
    "TOO_LONG",
    "NOT_COMBINED",
    "ParsedChunk",
    "ChunkParser",
    "malformed_reason",
]

# Verdict codes per record: counted-if-in-time, or why it is malformed.
OK, NO_VALUE, TOO_LONG, NOT_COMBINED = 0, 1, 2, 3


def malformed_reason(code: int, max_record_bytes: int) -> str:
    """The dead-letter reason for a malformed verdict code."""
    if code == NO_VALUE:
        return "malformed: no value"
    if code == TOO_LONG:
        return f"malformed: longer than {max_record_bytes} bytes"
    return "malformed: not a valid nginx combined-format line"


@dataclass(frozen=True)
class ParsedChunk:
    """One chunk parsed: per record a verdict code, its event time (ms since the epoch; 0 where the
    verdict is not OK) and its client's index into `ips` (canonical spellings, distinct; -1 where
    not OK)."""

    verdict: np.ndarray  # int8
    event_ms: np.ndarray  # int64
    ip_index: np.ndarray  # int32
    ips: list[str]

    def __len__(self) -> int:
        return len(self.verdict)


def _as_strings(values: pa.Array, candidate: np.ndarray) -> pa.Array:
    """`values` as UTF-8 strings, null where not a candidate or not valid UTF-8. A chunk with one
    bad byte sequence is checked record by record (rare: Arrow validates a chunk at once)."""
    masked = pc.if_else(pa.array(candidate), values, pa.scalar(None, pa.binary()))
    try:
        return masked.cast(pa.string())
    except pa.ArrowInvalid:
        pass
    decoded: list[str | None] = []
    for raw in masked.to_pylist():
        try:
            decoded.append(None if raw is None else raw.decode("utf-8"))
        except UnicodeDecodeError:
            decoded.append(None)
    return pa.array(decoded, pa.string())


def _distinct(
    column: pa.Array, decide: dict[str, int], compute: Callable[[str], int]
) -> tuple[np.ndarray, np.ndarray]:
    """(code per row, valid mask): `column`'s distinct values decided once each by `compute`
    (text -> int code, or -1: invalid), remembered in `decide` across chunks."""
    encoded = pc.dictionary_encode(column)
    if isinstance(encoded, pa.ChunkedArray):
        encoded = encoded.combine_chunks()
    words = encoded.dictionary.to_pylist()
    codes = np.empty(len(words), dtype=np.int64)
    for i, word in enumerate(words):
        code = decide.get(word)
        if code is None:
            code = compute(word)
            decide[word] = code
        codes[i] = code
    index = encoded.indices.fill_null(0).to_numpy(zero_copy_only=False)
    per_row = codes[index] if len(codes) else np.full(len(column), -1, dtype=np.int64)
    present = ~np.asarray(encoded.indices.is_null().to_numpy(zero_copy_only=False), dtype=bool)
    return per_row, present & (per_row != -1)


class ChunkParser:
    """Parses chunks of one read task; remembers the IPs and seconds it has decided."""

    def __init__(self, max_record_bytes: int) -> None:
        self.max_record_bytes = max_record_bytes
        self._times: dict[str, int] = {}
        self._ip_codes: dict[str, int] = {}
        self._canonical: dict[str, int] = {}
        self.ips: list[str] = []

    def _time_ms(self, text: str) -> int:
        try:
            return int(parse_time_local(text).timestamp()) * 1000
        except ParseError:
            return -1  # never a real time: those are whole seconds

    def _ip(self, text: str) -> int:
        try:
            spelling = client_ip(text)
        except ParseError:
            return -1
        code = self._canonical.get(spelling)
        if code is None:
            code = self._canonical[spelling] = len(self.ips)
            self.ips.append(spelling)
        return code

    def parse(self, values: pa.Array) -> ParsedChunk:
        """Verdicts, event times and client indices of one chunk of raw record values."""
        if isinstance(values, pa.ChunkedArray):
            values = values.combine_chunks()
        n = len(values)
        null = np.asarray(values.is_null().to_numpy(zero_copy_only=False), dtype=bool)
        sizes = pc.binary_length(values).fill_null(0).to_numpy(zero_copy_only=False)
        too_long = ~null & (sizes > self.max_record_bytes)
        candidate = ~null & ~too_long
        groups = pc.extract_regex(_as_strings(values, candidate), LINE_PATTERN_RE2)
        matched = np.asarray(groups.is_valid().to_numpy(zero_copy_only=False), dtype=bool)
        ip_code, ip_ok = _distinct(pc.struct_field(groups, "ip"), self._ip_codes, self._ip)
        times, time_ok = _distinct(pc.struct_field(groups, "time"), self._times, self._time_ms)
        ok = matched & ip_ok & time_ok
        verdict = np.full(n, OK, dtype=np.int8)
        verdict[~ok] = NOT_COMBINED
        verdict[too_long] = TOO_LONG
        verdict[null] = NO_VALUE
        return ParsedChunk(
            verdict=verdict,
            event_ms=np.where(ok, times, 0).astype(np.int64),
            ip_index=np.where(ok, ip_code, -1).astype(np.int32),
            ips=self.ips,
        )
