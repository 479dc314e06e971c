"""One parser truth, and no content that can fail a query: over the whole line grammar (dates from
year 1 to 9999, zone offsets -2359..+2359, `:60`, any month spelling, `\\xHH` escapes, NUL bytes,
lines from 0 bytes to 1 MB), the vectorised parse the job's read tasks run (formats.arrow_parse,
RE2 through Arrow), the Python parse (ledger, loadgen) and the driver's heartbeat base
(source.offset_reader) reach the same verdict, the same client IP and event time when counted,
and never raise anything but the typed rejection (ParseError)."""

from __future__ import annotations

import ipaddress
import os
import random
from collections.abc import Sequence
from typing import Protocol

import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ipcount.formats.accesslog import (
    ParseError,
    TimeRangeError,
    format_record,
    format_time_local,
    parse_record,
)
from ipcount.formats.arrow_parse import (
    OK,
    PREFIX_SCAN_MISSING,
    TIME_RANGE,
    ChunkParser,
    ParsedChunk,
)
from ipcount.source.offset_reader import nginx_event_ms

MONTHS = ["Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec"]
# The instants a line may carry: around year 1 to around year 9999 (UTC), either side of both ends.
MIN_MS, MAX_MS = -62_135_596_800_000, 253_402_300_799_000
ONE_MB = 1 << 20

# Characters that break naive parsers: brackets, quotes, escapes, spaces of every kind, line
# terminators RE2 and Python disagree on, Unicode digits and letters, NUL.
HOSTILE = (
    list('[]"\\ -/:+.')
    + ["\\x22", '\\"', "\\\\", "\\xC3\\xBC", "\\x00", "\\xZZ", "\t", "\n", "\r", "\x0b", "\x1c"]
    + ["\x85", "\u00a0", "\u2003", "\u2028", "\u0661", "\u00e9", "\U0001f600", "\x00", "\x7f"]
)
# What a long field is made of: nginx's escapes (4 bytes per byte >= 0x7F), plain text, hostile.
PAD = ["x", "\\xE2\\x82\\xAC", "\\x22", "%20", "a b", "\\\\", "\x00", '"', "]"]
ODD_MONTHS = ["feb", "FEB", "Foo", "Sept", "Jun ", "Mär", "J\u0430n", "jAN", "Ja", "January"]
ODD_IPS = ["999.1.1.1", "1.2.3", "1:2:3", "01.2.3.4", "1::2::3", "::", "-", "unix:/run/x.sock"]
ODD_IPS += ["unix:", "UNIX:", "unix", "unix::", "1.2.3.4%eth0", "[::1]"]
USERS = ["-", "evil] [01/Jan/2000:00:00:00 +0000]", "a b", " ", "x [y] z", "]", "]a [b", "\x00"]


class Pick(Protocol):
    """Where the generator's choices come from: hypothesis (shrinkable) or a seeded Random (cheap,
    so one example can hold hundreds of lines)."""

    def int(self, lo: int, hi: int) -> int: ...

    def choice(self, options: Sequence[str]) -> str: ...


class _Drawn:
    def __init__(self, draw: st.DrawFn) -> None:
        self.draw = draw

    def int(self, lo: int, hi: int) -> int:
        return self.draw(st.integers(lo, hi))

    def choice(self, options: Sequence[str]) -> str:
        return self.draw(st.sampled_from(options))


class _Seeded:
    def __init__(self, rnd: random.Random) -> None:
        self.rnd = rnd

    def int(self, lo: int, hi: int) -> int:
        return self.rnd.randint(lo, hi)

    def choice(self, options: Sequence[str]) -> str:
        return self.rnd.choice(options)


def _char(p: Pick) -> str:
    if p.int(0, 2) == 0:
        return p.choice(HOSTILE)
    code = p.int(0, 0x10FFFF) if p.int(0, 3) == 0 else p.int(0x20, 0x7E)
    return "?" if 0xD800 <= code <= 0xDFFF else chr(code)


def _text(p: Pick, max_size: int = 12) -> str:
    return "".join(_char(p) for _ in range(p.int(0, max_size)))


def _ip(p: Pick) -> str:
    kind = p.int(0, 12)
    if kind <= 3:
        return str(ipaddress.IPv4Address(p.int(0, 2**32 - 1)))
    if kind <= 7:
        v6 = ipaddress.IPv6Address(p.int(0, 2**128 - 1) >> p.int(0, 128))
        text = p.choice([v6.compressed, v6.exploded])
        return text.upper() if kind == 7 else text
    if kind <= 9:
        v4 = ipaddress.IPv4Address(p.int(0, 2**32 - 1))
        prefix = p.choice(["::ffff:", "::FFFF:", "0:0:0:0:0:ffff:", "64:ff9b::"])
        return prefix + p.choice([str(v4), f"{int(v4) >> 16:x}:{int(v4) & 0xFFFF:x}"])
    if kind == 10:
        return p.choice(ODD_IPS)
    if kind == 11:
        return "unix:"
    return _text(p)


def _time(p: Pick) -> str:
    """Any $time_local-shaped text: every year 1..9999 (padded or not), any month spelling, day,
    hour, minute, second up to :60 and beyond, offset -2359..+2359; or a date at either end."""
    if p.int(0, 1):
        year, day = p.int(1, 9999), f"{p.int(0, 39):02d}"
        hms = f"{p.int(0, 29):02d}:{p.int(0, 69):02d}:{p.int(0, 69):02d}"
        month = p.choice(MONTHS) if p.int(0, 2) else p.choice([*ODD_MONTHS, _char(p) * 3])
    else:
        # The first and last days of the range and of years nearby, where a zone offset moves
        # the UTC instant out of it (year 9999 with a negative offset) or just inside.
        date = p.choice(["31/Dec/9999", "01/Jan/0001", "01/Jan/1000", "31/Dec/9998", "29/Feb/2024"])
        day, month, y = date.split("/")
        year = int(y)
        hms = p.choice(["00:00:00", "23:59:59", "23:59:60", "00:00:60", "12:00:00", "00:01:00"])
    y = p.choice([f"{year:04d}", f"{year:04d}", str(year), f"{year:05d}", "٢٠٢٦"])
    zone = f"{p.choice('+-')}{p.int(0, 23):02d}{p.int(0, 59):02d}"
    return f"{day}/{month}/{y}:{hms} {zone}"


def _user(p: Pick) -> str:
    kind = p.int(0, 5)
    if kind <= 2:
        return "-"
    if kind == 3:
        return p.choice(USERS)
    return _text(p, 10) or "-"


def _line(p: Pick) -> bytes | None:
    """Mostly valid lines with hostile contents at any instant of the range; half broken in one
    place (a time from the whole grammar, an IP, a tail, a cut to any length, non-UTF-8); no value
    or 0 bytes now and then."""
    kind = p.int(0, 40)
    if kind == 0:
        return None
    if kind == 1:
        return b""
    ms = p.int(MIN_MS + 86_400_000, MAX_MS - 86_400_000) if p.int(0, 3) else 1_764_000_000_000
    offset = p.int(-18 * 60, 18 * 60)
    ip = _ip(p)
    text = format_record(
        ip if " " not in ip and ip else "1.2.3.4",
        ms,
        user=_user(p),
        path=_text(p, 30),
        referer=_text(p),
        user_agent=_text(p, 30),
        status=int(p.choice(["200", "400", "414", "503"])),
        body_bytes=p.int(0, 10**9),
        utc_offset_minutes=offset,
    )
    mutation = p.int(0, 13)
    if mutation in (1, 2, 9):
        text = text.replace(f"[{format_time_local(ms, offset)}]", f"[{_time(p)}]", 1)
    elif mutation == 3:
        text = _ip(p) + text[text.index(" ") :]
    elif mutation == 4:
        text += p.choice(["\n", "\r\n", " ", "\u2028", "\x85", '"', "\x00"])
    elif mutation == 5:
        cut = p.int(0, len(text))
        text = text[:cut] + p.choice(['"', "\\", " ", "]", "[", "\n", "\x00"]) + text[cut:]
    elif mutation == 6:
        text = text[: p.int(0, len(text))]  # truncated anywhere, down to 0 bytes
    elif mutation == 7:
        text = text.replace(" 200 ", p.choice([" 2000 ", " ٢٠٠ ", " 20 "]), 1)
    raw = text.encode("utf-8")
    if mutation == 8:
        at = p.int(0, len(raw))
        raw = (
            raw[:at]
            + p.choice(["\udcff", "\udcc3", "\udced\udca0\udc80"]).encode(
                "utf-8", "surrogateescape"
            )
            + raw[at:]
        )
    return raw


def _huge_line(p: Pick) -> bytes:
    """A line of 8 KB to 1 MB: a request, referer, user agent or user that long (what a real nginx
    writes for 8 KB headers escaped 4x, and far beyond), valid or broken at its end, far from the
    prefix."""
    size = int(p.choice(["8192", "8192", "102400", "102400", "1048576"])) + p.int(-64, 64)
    pad = p.choice(PAD)
    long = (pad * (size // len(pad) + 1))[:size]
    where = p.choice(["path", "referer", "user_agent", "user"])
    fields = {where: long if where != "path" else "/" + long}
    if where == "user":
        fields["user"] = long.replace('"', "q")
    ms = p.int(MIN_MS + 86_400_000, MAX_MS - 86_400_000)
    text = format_record("2001:db8::1", ms, utc_offset_minutes=p.int(-60, 60), **fields)
    return (text + p.choice(["", "", '"', " x", "\n", '\\"'])).encode("utf-8")


@st.composite
def drawn_lines(draw: st.DrawFn) -> bytes | None:
    return _line(_Drawn(draw))


def _python(line: bytes | None) -> tuple[str, str | None, int | None]:
    if line is None:
        return "malformed", None, None
    try:
        rec = parse_record(line)
    except TimeRangeError:
        return "out of range", None, None
    except ParseError:
        return "malformed", None, None
    return "counted", rec.ip, rec.event_ms


def _arrow(batch: list[bytes | None]) -> list[tuple[str, str | None, int | None]]:
    # The compiled prefix scan (where built) and Arrow's kernels: one verdict each, the same.
    arrays = pa.array(batch, pa.binary())
    native, kernels = (_verdicts(ChunkParser(native=n).parse(arrays)) for n in (True, False))
    assert native == kernels
    return native


def _verdicts(parsed: ParsedChunk) -> list[tuple[str, str | None, int | None]]:
    out: list[tuple[str, str | None, int | None]] = []
    for verdict, ms, ip in zip(parsed.verdict, parsed.event_ms, parsed.ip_index, strict=True):
        if verdict == OK:
            out.append(("counted", parsed.ips[ip], int(ms)))
        else:
            out.append(("out of range" if verdict == TIME_RANGE else "malformed", None, None))
    return out


def _check(batch: list[bytes | None]) -> None:
    for line, got in zip(batch, _arrow(batch), strict=True):
        want = _python(line)
        assert got == want, (line or b"")[:300]
        # The driver's heartbeat base: the same event time, or none, and never an exception.
        assert nginx_event_ms(line) == (want[2] if want[0] == "counted" else None)


# 120 chunks of 260-309 lines (up to 8 drawn by hypothesis, the rest from a seed it draws):
# at least 20,000 generated lines per run, each example one chunk, one in two with a huge line.
@settings(
    max_examples=120,
    deadline=None,
    suppress_health_check=[
        HealthCheck.too_slow,
        HealthCheck.large_base_example,
        HealthCheck.data_too_large,
    ],
)
@given(
    drawn=st.lists(drawn_lines(), max_size=8),
    seed=st.integers(0, 2**64 - 1),
    n=st.integers(260, 300),
    huge=st.booleans(),
)
def test_both_parsers_and_the_heartbeat_base_agree_on_the_whole_grammar(
    drawn: list[bytes | None], seed: int, n: int, huge: bool
) -> None:
    rnd = random.Random(seed)
    seeded = _Seeded(rnd)
    batch = drawn + [_line(seeded) for _ in range(n)]
    if huge:
        batch.insert(rnd.randint(0, len(batch)), _huge_line(seeded))
    _check(batch)


def test_a_chunk_with_one_non_utf8_line_rejects_only_that_line() -> None:
    good = format_record("10.0.0.1", 1_700_000_000_000).encode()
    got = _arrow([good, good + b"\xff", good])
    assert [kind for kind, _, _ in got] == ["counted", "malformed", "counted"]


def test_year_9999_with_a_negative_offset_is_out_of_range_not_an_error() -> None:
    line = b'1.2.3.4 - - [31/Dec/9999:23:59:59 -0100] "GET / HTTP/1.1" 200 1 "-" "-"'
    last = b'1.2.3.4 - - [31/Dec/9999:23:59:59 +0000] "GET / HTTP/1.1" 200 1 "-" "-"'
    first = b'1.2.3.4 - - [01/Jan/1000:00:00:00 +1800] "GET / HTTP/1.1" 200 1 "-" "-"'
    assert _python(line) == ("out of range", None, None)
    assert _arrow([line, last, first]) == [
        ("out of range", None, None),
        ("counted", "1.2.3.4", MAX_MS),
        ("counted", "1.2.3.4", -30_610_288_800_000),  # 0999-12-31T06:00:00Z
    ]
    assert nginx_event_ms(line) is None


def test_a_100_kb_line_nginx_writes_is_counted_by_both_parsers() -> None:
    # 8 KB request line, referer and user agent of bytes >= 0x7F: nginx writes each as \xHH.
    line = format_record(
        "203.0.113.9",
        1_700_000_000_000,
        path="/" + "\\xC3\\xBC" * 1000,
        referer="https://example.com/" + "\\xE2\\x82\\xAC" * 2700,
        user_agent="Mozilla/5.0 " + "\\xF0\\x9F\\x98\\x80" * 2000,
    ).encode()
    assert len(line) > 90_000
    assert _arrow([line]) == [_python(line)] == [("counted", "203.0.113.9", 1_700_000_000_000)]


def test_a_unix_socket_client_is_counted_under_unix() -> None:
    line = format_record("unix:", 1_700_000_000_000).encode()
    assert _arrow([line]) == [_python(line)] == [("counted", "unix:", 1_700_000_000_000)]


def test_a_chunk_that_is_a_slice_of_a_larger_array_parses_like_its_own_lines() -> None:
    # Arrow hands out slices that share their parent's buffers (a chunk of a chunked column):
    # what a line holds is read from where that line starts, never from the parent's start.
    lines: list[bytes | None] = [
        format_record("2001:db8::1", 1_700_000_000_000, user="x [y] z").encode(),
        None,
        format_record(
            "10.0.0.1", 1_700_000_001_000, user="evil] [01/Jan/2000:00:00:00 +0000]"
        ).encode(),
        b"not a line",
        format_record("192.0.2.77", 1_700_000_002_000).encode(),
    ]
    whole = pa.array([b"x" * 37, *lines, b"y"], pa.binary())
    for native in (True, False):
        parsed = ChunkParser(native=native).parse(whole.slice(1, len(lines)))
        got = [
            (parsed.ips[ip], int(ms)) if verdict == OK else None
            for verdict, ms, ip in zip(
                parsed.verdict, parsed.event_ms, parsed.ip_index, strict=True
            )
        ]
        want = [None if w[0] != "counted" else (w[1], w[2]) for w in map(_python, lines)]
        assert got == want == [
            ("2001:db8::1", 1_700_000_000_000), None, ("10.0.0.1", 1_700_000_001_000), None,
            ("192.0.2.77", 1_700_000_002_000),
        ]  # fmt: skip


# Lines at the edges of the grammar's tail and prefix, each beside its verdict.
GOOD = format_record("10.0.0.1", 1_700_000_000_000)
EDGES = [
    GOOD,
    GOOD + "\n",  # a final newline: RE2's \z is the absolute end
    GOOD[:-1],  # the user agent never closed
    GOOD.replace('" 200 ', '" 20 '),  # a two-digit status
    GOOD.replace('" 200 ', '" 2000 '),
    GOOD.replace(" 200 ", "  200 "),
    GOOD.replace('" "-" "', '" "-"  "'),
    '1.2.3.4 - - [22/Nov/2026:09:57:08 +0000] "GET / HTTP/1.1" 200 - "-" "-"',
    '1.2.3.4 - - [22/Nov/2026:09:57:08 +0000] "GET / HTTP/1.1" 200 -1 "-" "-"',
    '1.2.3.4 - - [22/Nov/2026:09:57:08 +0000] "GET / HTTP/1.1" 200 12 "-" "-\\"',
    '1.2.3.4 - - [22/Nov/2026:09:57:08 +0000] "GET / HTTP/1.1" 200 12 "-" "-\\\\"',
    '1.2.3.4 - - [22/Nov/2026:09:57:08 +0000] "GET /\\" 200 12 "-" "-"',
    '1.2.3.4 - - [22/Nov/2026:09:57:08 +0000] "\\x16\\x03" 400 0 "-" "-"',
    '1.2.3.4 - - [22/Nov/2026:09:57:08 +0000] "" 400 0 "" ""',
    '1.2.3.4 - - [22/Nov/2026:09:57:08 +0000] "x" 400 0 "" "" ',
    '1.2.3.4 -  [22/Nov/2026:09:57:08 +0000] "x" 400 0 "" ""',  # an empty $remote_user
    '1.2.3.4 - [22/Nov/2026:09:57:08 +0000] "x" 400 0 "" ""',
    '1.2.3.4  - - [22/Nov/2026:09:57:08 +0000] "x" 400 0 "" ""',
    '1.2.3.4\t- - [22/Nov/2026:09:57:08 +0000] "x" 400 0 "" ""',
    '1.2.3.4 -\u00a0- [22/Nov/2026:09:57:08 +0000] "x" 400 0 "" ""',
    '1.2.3.4 - a"b [22/Nov/2026:09:57:08 +0000] "x" 400 0 "" ""',
    '1.2.3.4 - evil] [01/Jan/2000 [22/Nov/2026:09:57:08 +0000] "x" 400 0 "" ""',
    '1.2.3.4 - - [22/Nov/2026:09:57:08 +0000]  "x" 400 0 "" ""',
    '1.2.3.4 - - [22/Nov/2026:09:57:08 +000] "x" 400 0 "" ""',
    '1.2.3.4 - - [22/nov/2026:09:57:08 +0000] "x" 400 0 "" ""',
    '1.2.3.4 - - [22/Nov/0026:09:57:08 +0000] "x" 400 0 "" ""',
    '1.2.3.4 - - [22/Nov/2026:09:57:08 *0000] "x" 400 0 "" ""',
    '1.2.3.4 - - [22/Nov/2026:09:57:08 +0000] "x\x00y" 400 0 "\u00e9" "\U0001f600"',
    # Long runs of escapes (nginx's \xHH for every byte >= 0x7F), with escaped quotes among them.
    format_record("10.0.0.2", 1_700_000_000_000, path="/" + "\\xC3\\xBC" * 3000),
    r'1.2.3.4 - - [22/Nov/2026:09:57:08 +0000] "GET /a\"b\\c\" HTTP/1.1" 200 1 "\"" "\\"',
    r'1.2.3.4 - - [22/Nov/2026:09:57:08 +0000] "GET /a\"b\\c\" HTTP/1.1" 200 1 "\"" "\"',
    r'1.2.3.4 - - [22/Nov/2026:09:57:08 +0000] "' + "\\x41" * 5000 + r'\"" 400 0 "-" "-"',
    r'1.2.3.4 - - [22/Nov/2026:09:57:08 +0000] "' + "\\x41" * 5000 + r'\" 400 0 "-" "-"',
    "",
    '"',
    '- - - [22/Nov/2026:09:57:08 +0000] "',
]


def _grammar_masks(batch: list[bytes | None]) -> tuple[list[bool], list[bool]]:
    """Which lines are of the grammar: the compiled walk's verdict and RE2's, line for line."""
    parser = ChunkParser()
    if parser._lines is None:
        pytest.skip(f"the prefix scan is {PREFIX_SCAN_MISSING}")
    _, strings, utf8 = parser._decode(pa.array(batch, pa.binary()))
    compiled = parser._match_lines(strings, utf8).tolist()
    re2 = ChunkParser(native=False)._match_lines(strings, utf8).tolist()
    return compiled, re2


def test_the_compiled_grammar_walk_gives_re2s_verdict_at_the_edges() -> None:
    batch: list[bytes | None] = [line.encode("utf-8") for line in EDGES] + [
        None,
        b"\xff" + GOOD.encode(),
    ]
    compiled, re2 = _grammar_masks(batch)
    assert compiled == re2, [
        (line, c, r) for line, c, r in zip(batch, compiled, re2, strict=True) if c != r
    ]
    assert re2[:3] == [True, False, False] and sum(re2) > 5


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(drawn=st.lists(drawn_lines(), max_size=8), seed=st.integers(0, 2**64 - 1))
def test_the_compiled_grammar_walk_gives_re2s_verdict_on_every_generated_line(
    drawn: list[bytes | None], seed: int
) -> None:
    seeded = _Seeded(random.Random(seed))
    batch = drawn + [_line(seeded) for _ in range(200)]
    compiled, re2 = _grammar_masks(batch)
    assert compiled == re2, [
        (line, c, r) for line, c, r in zip(batch, compiled, re2, strict=True) if c != r
    ][:3]


def test_the_compiled_prefix_scan_is_built_where_ci_runs() -> None:
    # Without it every test above compares the kernels with themselves: CI builds it (gcc).
    if os.environ.get("CI") == "true":
        assert PREFIX_SCAN_MISSING is None, PREFIX_SCAN_MISSING
    elif PREFIX_SCAN_MISSING is not None:
        pytest.skip(f"the prefix scan is {PREFIX_SCAN_MISSING}")
