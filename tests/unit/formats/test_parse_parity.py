"""One parser truth: the vectorised parse the job's read tasks run (formats.arrow_parse, RE2 through
Arrow) and the Python parse (ledger, driver, loadgen) accept and reject exactly the same lines and
extract the same client IP and event time, on generated hostile combined-format lines; and the
read task's rejects are exactly the lines the Python parser rejects."""

from __future__ import annotations

import ipaddress

import pyarrow as pa
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ipcount.formats.accesslog import ParseError, format_record, format_time_local, parse_record
from ipcount.formats.arrow_parse import OK, TOO_LONG, ChunkParser

MAX_BYTES = 8192
MONTHS = ["Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec"]

# Characters that break naive parsers: brackets, quotes, escapes, spaces of every kind, line
# terminators RE2 and Python disagree on, Unicode digits and letters.
HOSTILE = st.sampled_from(
    list('[]"\\ -/:+.')
    + ["\\x22", '\\"', "\\\\", "\t", "\n", "\r", "\x0b", "\x1c", "\x85"]
    + ["\u00a0", "\u2003", "\u2028", "\u0661", "\u00e9", "\U0001f600", "\x00", "\x7f"]
)
TEXT = st.lists(st.one_of(HOSTILE, st.characters(codec="utf-8")), max_size=12).map("".join)
WORD = st.one_of(st.just("-"), TEXT)


@st.composite
def ips(draw: st.DrawFn) -> str:
    kind = draw(st.integers(0, 5))
    if kind == 0:
        return str(ipaddress.IPv4Address(draw(st.integers(0, 2**32 - 1))))
    if kind in (1, 2):
        v6 = ipaddress.IPv6Address(draw(st.integers(0, 2**128 - 1)) >> draw(st.integers(0, 128)))
        text = draw(st.sampled_from([v6.compressed, v6.exploded]))
        return text.upper() if kind == 2 else text
    if kind == 3:
        v4 = ipaddress.IPv4Address(draw(st.integers(0, 2**32 - 1)))
        prefix = draw(st.sampled_from(["::ffff:", "::FFFF:", "0:0:0:0:0:ffff:", "64:ff9b::"]))
        return prefix + draw(st.sampled_from([str(v4), f"{int(v4) >> 16:x}:{int(v4) & 0xFFFF:x}"]))
    if kind == 4:
        return draw(st.sampled_from(["999.1.1.1", "1.2.3", "1:2:3", "01.2.3.4", "1::2::3", "::"]))
    return draw(TEXT)


@st.composite
def times(draw: st.DrawFn) -> str:
    if draw(st.booleans()):
        # A well-formed time_local: any instant nginx could write, any zone offset Java accepts.
        ms = draw(st.integers(-30_000_000_000_000, 250_000_000_000_000))
        return format_time_local(ms, draw(st.integers(-18 * 60, 18 * 60)))
    day = draw(st.sampled_from(["01", "28", "29", "30", "31", "32", "00", "1", "٠١"]))
    month = draw(st.sampled_from([*MONTHS, "feb", "FEB", "Foo", "Sept"]))
    year = draw(st.sampled_from(["2024", "2023", "2000", "1900", "1000", "0999", "9999", "0000"]))
    hms = draw(st.sampled_from(["00:00:00", "23:59:59", "24:00:00", "12:60:00", "12:00:60"]))
    zone = draw(st.sampled_from(["+0000", "-0000", "+1800", "-1800", "+1801", "+0060", "+2359"]))
    return f"{day}/{month}/{year}:{hms} {zone}"


# Legal but hostile field contents: $remote_user holds anything, spaces included (nginx escapes
# only `"`, `\`, control bytes and bytes >= 0x7F in it; raw ones here make lines nginx cannot
# write, which both parsers must reject alike), quoted fields anything (format_record escapes
# them as nginx does).
USER = st.one_of(
    st.just("-"),
    st.text(
        alphabet=st.one_of(
            st.sampled_from(list('[]"\\-:') + ["\u00a0", "\u2003", "\u0661", "\x85"]),
            st.characters(codec="utf-8"),
        ),
        min_size=1,
        max_size=10,
    ),
    # A `]` first, spaces and a fake time: what a client can send as its Basic-auth user name.
    st.text(alphabet="[]ab ", min_size=1, max_size=4).map(lambda u: "]" + u),
    st.sampled_from(["evil] [01/Jan/2000:00:00:00 +0000]", "a b", " ", "x [y] z"]),
)
FREE = st.one_of(TEXT, st.text(max_size=60))


@st.composite
def lines(draw: st.DrawFn) -> bytes:
    """Mostly valid lines with hostile contents; a third of them broken in one place."""
    ms = draw(st.integers(-30_000_000_000_000, 250_000_000_000_000))
    offset = draw(st.integers(-18 * 60, 18 * 60))
    ip = draw(ips())
    text = format_record(
        ip if " " not in ip and ip else "1.2.3.4",
        ms,
        user=draw(USER),
        path=draw(FREE),
        referer=draw(FREE),
        user_agent=draw(FREE),
        status=draw(st.sampled_from([200, 404, 503])),
        body_bytes=draw(st.integers(0, 10**9)),
        utc_offset_minutes=offset,
    )
    mutation = draw(st.integers(0, 9))
    if mutation == 1:
        text = text.replace(f"[{format_time_local(ms, offset)}]", f"[{draw(times())}]", 1)
    elif mutation == 2:
        text = draw(ips()) + text[text.index(" ") :]
    elif mutation == 3:
        text += draw(st.sampled_from(["\n", "\r\n", " ", "\u2028", "\x85", '"']))
    elif mutation == 4:
        cut = draw(st.integers(0, len(text)))
        text = text[:cut] + draw(st.sampled_from(['"', "\\", " ", "]", "[", "\n"])) + text[cut:]
    elif mutation == 5:
        text = text.replace(" 200 ", draw(st.sampled_from([" 2000 ", " ٢٠٠ ", " 20 "])), 1)
    if mutation == 7:
        text = text.replace(" HTTP/1.1", "/" + "x" * draw(st.integers(8000, 9000)) + " HTTP/1.1")
    raw = text.encode("utf-8")
    if mutation == 6:
        raw += b"\xff"  # not UTF-8
    return raw


def _python(line: bytes | None) -> tuple[str, str | None, int | None]:
    if line is None:
        return "malformed", None, None
    if len(line) > MAX_BYTES:
        return "too long", None, None
    try:
        rec = parse_record(line)
    except ParseError:
        return "malformed", None, None
    return "counted", rec.ip, rec.event_ms


def _arrow(batch: list[bytes | None]) -> list[tuple[str, str | None, int | None]]:
    parsed = ChunkParser(MAX_BYTES).parse(pa.array(batch, pa.binary()))
    out = []
    for verdict, ms, ip in zip(parsed.verdict, parsed.event_ms, parsed.ip_index, strict=True):
        if verdict == OK:
            out.append(("counted", parsed.ips[ip], int(ms)))
        else:
            out.append(("too long" if verdict == TOO_LONG else "malformed", None, None))
    return out


# 100 x 100-300 = at least 10,000 generated lines per run, each example one chunk.
@settings(
    max_examples=100,
    deadline=None,
    suppress_health_check=[
        HealthCheck.too_slow,
        HealthCheck.large_base_example,
        HealthCheck.data_too_large,
    ],
)
@given(batch=st.lists(st.one_of(lines(), st.none()), min_size=100, max_size=300))
def test_vectorised_and_python_parsers_agree_on_hostile_lines(batch: list[bytes | None]) -> None:
    for line, got in zip(batch, _arrow(batch), strict=True):
        assert got == _python(line), (line or b"")[:300]


def test_a_chunk_with_one_non_utf8_line_rejects_only_that_line() -> None:
    good = format_record("10.0.0.1", 1_700_000_000_000).encode()
    got = _arrow([good, good + b"\xff", good])
    assert [kind for kind, _, _ in got] == ["counted", "malformed", "counted"]
