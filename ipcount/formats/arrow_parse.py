"""The nginx combined-format parse, vectorised over an Arrow array of raw records: what the job's
read tasks run before they combine counts (executors)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import cast

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from ipcount.formats.accesslog import (
    LINE_PATTERN_RE2,
    TIME_TEXT_LENGTH,
    ParseError,
    TimeRangeError,
    client_ip,
    parse_time_local,
)

__all__ = [
    "PREFIX_SCAN_MISSING",
    "OK",
    "NO_VALUE",
    "NOT_UTF8",
    "NOT_COMBINED",
    "BAD_IP",
    "BAD_TIME",
    "TIME_RANGE",
    "ParsedChunk",
    "ChunkParser",
    "malformed_reason",
]

try:  # the compiled helper (setup.py); without it Arrow's kernels cut the same texts
    from ipcount.formats import _prefix_scan  # type: ignore[attr-defined]
except ImportError as exc:
    _prefix_scan = None
    PREFIX_SCAN_MISSING: str | None = f"not built ({exc})"
else:
    PREFIX_SCAN_MISSING = None

# Verdict codes per record: counted-if-in-time, or why it is malformed.
OK, NO_VALUE, NOT_UTF8, NOT_COMBINED, BAD_IP, BAD_TIME, TIME_RANGE = range(7)
_REASONS = {
    NO_VALUE: "malformed: no value",
    NOT_UTF8: "malformed: not UTF-8",
    NOT_COMBINED: "malformed: not a valid nginx combined-format line",
    BAD_IP: "malformed: $remote_addr is not an IP address (nor unix:)",
    BAD_TIME: "malformed: $time_local is not a real time (dd/Mon/yyyy:HH:mm:ss +hhmm)",
    TIME_RANGE: (
        "malformed: event time outside 0001-01-01T00:00:00Z..9999-12-31T23:59:59Z "
        "(Spark's timestamp range)"
    ),
}
# What `_time_ms` answers for a time that is not one; real times are whole seconds (multiples of
# 1000 ms), so neither code is ever a real time.
_NOT_A_TIME, _OUT_OF_RANGE = -1, -2


def malformed_reason(code: int) -> str:
    """The dead-letter reason for a malformed verdict code."""
    return _REASONS.get(code, _REASONS[NOT_COMBINED])


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


def _as_strings(values: pa.Array) -> pa.Array:
    """`values` as UTF-8 strings, null where null or not valid UTF-8. A chunk with one bad byte
    sequence is checked record by record (rare: Arrow validates a chunk at once)."""
    try:
        return values.cast(pa.string())
    except pa.ArrowInvalid:
        pass
    decoded: list[str | None] = []
    for raw in values.to_pylist():
        try:
            decoded.append(None if raw is None else raw.decode("utf-8"))
        except UnicodeDecodeError:
            decoded.append(None)
    return pa.array(decoded, pa.string())


# The longest text an IP address has: IPv6 with an IPv4 tail,
# `ffff:ffff:ffff:ffff:ffff:ffff:255.255.255.255` (no zone ids: IP_PATTERN has none). A longer
# `$remote_addr` is rejected at once, never remembered.
_LONGEST_IP_TEXT = 45
# How many texts a read task remembers the verdict of: accepted ones (real clients and seconds, as
# many as a busy task meets) and rejected ones, each a table forgotten when full, so junk costs at
# most a few MB however much of it a task reads.
_MAX_ACCEPTED, _MAX_REJECTED = 262_144, 4_096


class _Decided:
    """Codes of the texts a task has decided (>= 0 accepted, < 0 rejected), bounded in entries."""

    def __init__(self) -> None:
        self._accepted: dict[str, int] = {}
        self._rejected: dict[str, int] = {}

    def get(self, text: str) -> int | None:
        code = self._accepted.get(text)
        return self._rejected.get(text) if code is None else code

    def codes(self, texts: list[str]) -> list[int | None]:
        """`get` of each text (one C-level pass over the accepted ones, the common case)."""
        out = list(map(self._accepted.get, texts))
        if self._rejected and None in out:
            for i, code in enumerate(out):
                if code is None:
                    out[i] = self._rejected.get(texts[i])
        return out

    def put(self, text: str, code: int) -> None:
        table, cap = (
            (self._accepted, _MAX_ACCEPTED) if code >= 0 else (self._rejected, _MAX_REJECTED)
        )
        if len(table) >= cap:
            table.clear()
        table[text] = code

    def __len__(self) -> int:
        return len(self._accepted) + len(self._rejected)


def _codes(texts: list[str], decide: _Decided, compute: Callable[[str], int]) -> np.ndarray:
    """Each text's code (int64), `compute`d (text -> int code) only for texts `decide` does not
    remember yet, which it then remembers across chunks."""
    known = decide.codes(texts)
    for i, code in enumerate(known):
        if code is None:
            known[i] = code = compute(texts[i])
            decide.put(texts[i], code)
    return np.array(known, dtype=np.int64)


def _distinct(
    column: pa.Array, decide: _Decided, compute: Callable[[str], int]
) -> tuple[np.ndarray, np.ndarray]:
    """(code per row, present mask): `column`'s distinct values decided once each (`_codes`)."""
    encoded = pc.dictionary_encode(column)
    if isinstance(encoded, pa.ChunkedArray):
        encoded = encoded.combine_chunks()
    codes = _codes(encoded.dictionary.to_pylist(), decide, compute)
    index = encoded.indices.fill_null(0).to_numpy(zero_copy_only=False)
    per_row = codes[index] if len(codes) else np.full(len(column), -1, dtype=np.int64)
    present = ~np.asarray(encoded.indices.is_null().to_numpy(zero_copy_only=False), dtype=bool)
    return per_row, present


def _decided_rows(
    index: bytes, texts: list[str], decide: _Decided, compute: Callable[[str], int]
) -> np.ndarray:
    """The code per row of the helper's grouping (`index`: an int32 per row into `texts`, -1
    where the line did not match, whose code is -1): each distinct text decided once
    (`_codes`)."""
    codes = np.append(_codes(texts, decide, compute), np.int64(-1))
    return codes[np.frombuffer(index, dtype=np.int32)]


def _value_offsets(strings: pa.Array) -> np.ndarray:
    """Where each value of a string array begins in its data buffer, and where the last ends."""
    offsets = np.frombuffer(strings.buffers()[1], dtype=np.int32)
    return offsets[strings.offset : strings.offset + len(strings) + 1].astype(np.int64)


def _slices(
    strings: pa.Array, lo: np.ndarray, hi: np.ndarray, valid: np.ndarray, n: int
) -> pa.Array:
    """Bytes [lo, hi) of each value's data as strings (null where not `valid`): an array over the
    same data whose values alternate slice and gap (offsets lo0, hi0, lo1, hi1, ...), then every
    other one taken."""
    offsets = np.empty(2 * n + 1, dtype=np.int32)
    offsets[0 : 2 * n : 2] = lo
    offsets[1 : 2 * n : 2] = hi
    offsets[2 * n] = hi[-1]
    spans = pa.Array.from_buffers(
        pa.string(), 2 * n, [None, pa.py_buffer(offsets), strings.buffers()[2]]
    )
    index = pa.array(np.arange(0, 2 * n, 2, dtype=np.int32), mask=~valid)
    return spans.take(index)


def _mask(array: pa.Array) -> np.ndarray:
    return np.asarray(array.fill_null(False).to_numpy(zero_copy_only=False), dtype=bool)


class ChunkParser:
    """Parses chunks of one read task; remembers the IPs and seconds it has decided.

    The same truth as `accesslog.parse_record`, by construction: whether a line is one is the same
    grammar (`LINE_PATTERN_RE2`, RE2's spelling of `LINE_PATTERN`, matched by RE2's DFA without
    captures, fast at any length; or walked by the compiled helper, which the parity tests hold
    to RE2's verdict line for line), the client and `$time_local` are taken by position from the
    line's prefix (up to its first `"`: accesslog._prefix), and each *distinct* client IP and
    `$time_local` text of a chunk goes through the very functions the Python parser uses
    (`client_ip`, `parse_time_local`), so no second IP or time rule exists. A chunk of a Kafka
    partition holds few distinct seconds and IPs, so those Python calls are a small part of the
    work; the per-line work (UTF-8 check, grammar, cuts) is Arrow's C++ or the helper's C. No
    length limit: what the bytes hold decides, never how many there are, and no content raises
    (every failure is a verdict code with its reason). What it remembers is bounded: a client
    text longer than any IP is rejected unseen, and the decided texts are bounded tables
    (`_Decided`).
    """

    def __init__(self, native: bool = True) -> None:
        self._times = _Decided()
        self._ip_codes = _Decided()
        self._canonical: dict[str, int] = {}
        self.ips: list[str] = []
        # Check the lines, cut and group the prefix texts with the compiled helper where built.
        helper = _prefix_scan if native else None
        self._lines = None if helper is None else helper.lines
        self._scan = None if helper is None else helper.scan

    def _time_ms(self, text: str) -> int:
        try:
            return int(parse_time_local(text).timestamp()) * 1000
        except TimeRangeError:
            return _OUT_OF_RANGE
        except ParseError:
            return _NOT_A_TIME

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
        null, strings, utf8 = self._decode(values)
        matched = self._match_lines(strings, utf8)
        if self._scan is not None:
            ip_code, times = self._scanned(strings, matched)
            ip_present = time_present = matched
        else:
            ip_text, time_text = self._prefix_fields(strings, matched)
            ip_code, ip_present = self._clients(ip_text)
            times, time_present = self._event_times(time_text)
        return self._verdicts(null, utf8, matched, ip_code, ip_present, times, time_present)

    # Each step a method of its own: `ipcount bench costs` profiles them one by one.

    def _decode(self, values: pa.Array) -> tuple[np.ndarray, pa.Array, np.ndarray]:
        """(null mask, the values as UTF-8 strings, valid-UTF-8 mask)."""
        null = np.asarray(values.is_null().to_numpy(zero_copy_only=False), dtype=bool)
        strings = _as_strings(values)
        utf8 = ~np.asarray(strings.is_null().to_numpy(zero_copy_only=False), dtype=bool)
        return null, strings, utf8

    def _match_lines(self, strings: pa.Array, utf8: np.ndarray) -> np.ndarray:
        """The whole line against the grammar: the compiled helper's walk of each line where it
        is built (the same verdict as RE2's, ~5x cheaper), else RE2's DFA (no captures)."""
        if self._lines is None:
            return _mask(pc.match_substring_regex(strings, LINE_PATTERN_RE2))
        _, offsets, data = strings.buffers()
        n = len(strings)
        if data is None or n == 0:
            return np.zeros(n, dtype=bool)
        found = self._lines(data, offsets, strings.offset, n, utf8.view(np.uint8))
        return np.frombuffer(found, dtype=np.uint8).astype(bool)

    def _prefix_fields(self, strings: pa.Array, matched: np.ndarray) -> tuple[pa.Array, pa.Array]:
        """The client and `$time_local` texts of the lines that matched (null elsewhere), by
        position, no regex: in a line of the grammar the client runs up to the first space, and
        the prefix ends at the line's first `"` with `[$time_local] "` (accesslog._prefix), its
        26 characters ending 2 bytes before that `"` (ASCII bytes never occur inside a UTF-8
        sequence). ~4x cheaper than capturing them with a prefix regex (`ipcount bench costs`)."""
        n = len(strings)
        if not matched.any():
            return pa.nulls(n, pa.string()), pa.nulls(n, pa.string())
        start = _value_offsets(strings)
        space = pc.find_substring(strings, " ").fill_null(0).to_numpy(zero_copy_only=False)
        quote = pc.find_substring(strings, '"').fill_null(0).to_numpy(zero_copy_only=False)
        begin = start[:-1]
        # A text longer than any IP is rejected unseen (as ""): it is no IP however it is spelt.
        ip_end = np.where(matched & (space <= _LONGEST_IP_TEXT), begin + space, begin)
        time_begin = np.where(matched, begin + quote - 2 - TIME_TEXT_LENGTH, begin)
        time_end = np.where(matched, time_begin + TIME_TEXT_LENGTH, begin)
        return (
            _slices(strings, begin, ip_end, matched, n),
            _slices(strings, time_begin, time_end, matched, n),
        )

    def _scanned(self, strings: pa.Array, matched: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """_prefix_fields, _clients and _event_times in one: the compiled helper cuts the same
        texts at the same positions and groups the distinct ones, each then decided as there."""
        n = len(strings)
        if not matched.any():
            return np.full(n, -1, dtype=np.int64), np.full(n, -1, dtype=np.int64)
        _, offsets, data = strings.buffers()
        scan = cast(Callable[..., tuple[bytes, list[str], bytes, list[str]]], self._scan)
        ip_index, ip_texts, time_index, time_texts = scan(
            data, offsets, strings.offset, n, matched.view(np.uint8),
            _LONGEST_IP_TEXT, TIME_TEXT_LENGTH,
        )  # fmt: skip
        return (
            _decided_rows(ip_index, ip_texts, self._ip_codes, self._ip),
            _decided_rows(time_index, time_texts, self._times, self._time_ms),
        )

    def _clients(self, ip_text: pa.Array) -> tuple[np.ndarray, np.ndarray]:
        return _distinct(ip_text, self._ip_codes, self._ip)

    def _event_times(self, time_text: pa.Array) -> tuple[np.ndarray, np.ndarray]:
        return _distinct(time_text, self._times, self._time_ms)

    def _verdicts(
        self,
        null: np.ndarray,
        utf8: np.ndarray,
        matched: np.ndarray,
        ip_code: np.ndarray,
        ip_present: np.ndarray,
        times: np.ndarray,
        time_present: np.ndarray,
    ) -> ParsedChunk:
        ip_ok = ip_present & (ip_code >= 0)
        time_ok = time_present & (times % 1000 == 0)
        ok = matched & ip_ok & time_ok
        verdict = np.full(len(null), OK, dtype=np.int8)
        # Later rules win: the first failure in parse_record's order is the reason.
        verdict[~ok & ~time_ok] = BAD_TIME
        verdict[~ok & time_present & (times == _OUT_OF_RANGE)] = TIME_RANGE
        verdict[~ok & ~ip_ok] = BAD_IP
        verdict[~matched] = NOT_COMBINED
        verdict[~utf8] = NOT_UTF8
        verdict[null] = NO_VALUE
        return ParsedChunk(
            verdict=verdict,
            event_ms=np.where(ok, times, 0).astype(np.int64),
            ip_index=np.where(ok, ip_code, -1).astype(np.int32),
            ips=self.ips,
        )
