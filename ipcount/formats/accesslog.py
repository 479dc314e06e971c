"""The nginx combined access-log format in one place: formatting (loadgen) and parsing (job, tests),
with the line grammar written once for Python's `re` and for RE2 (formats.arrow_parse)."""

from __future__ import annotations

import ipaddress
import re
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta, timezone

__all__ = [
    "LINE_PATTERN",
    "LINE_PATTERN_RE2",
    "TIME_TEXT_LENGTH",
    "UNIX_CLIENT",
    "EVENT_TIME_RANGE",
    "IPV4_PATTERN",
    "IPV6_PATTERN",
    "IP_PATTERN",
    "TIME_PATTERN",
    "GROUP_IP",
    "GROUP_TIME",
    "AccessRecord",
    "format_record",
    "format_time_local",
    "parse_record",
    "parse_time_local",
    "canonical_ip",
    "client_ip",
    "ParseError",
    "TimeRangeError",
]

# $remote_addr - $remote_user [$time_local] "$request" $status $body_bytes_sent "$http_referer"
# "$http_user_agent"
# The line grammar is written once (`_prefix`, `_tail`) and spelled twice: `LINE_PATTERN` for
# Python's `re` (the ledger, the driver's heartbeat base, loadgen) and, for RE2, which the job's
# read tasks run through Arrow (`formats.arrow_parse`), `LINE_PATTERN_RE2` (the whole line, nothing
# captured: RE2's fast DFA; the read tasks then take the client and `$time_local`, the only fields
# counted, from the prefix by position, see `_prefix`). They keep to the subset where the two
# engines agree (explicit ASCII classes instead of \S and \d, which Python widens to Unicode;
# `[\s\S]` instead of `.`, whose line terminators differ; an absolute end instead of `$`, which
# Python also lets match before a final newline). IPs and times are decided by this module's
# functions in both paths. Where the compiled helper is built, the read tasks walk the same
# grammar in C instead of RE2 (formats/_prefix_scan.c, `access_line`: a third spelling, for a
# third of RE2's CPU). A property test (tests/unit/formats/test_parse_parity.py) runs every
# parser over generated hostile lines and holds the C walk to RE2's verdict line for line.
# A quoted field with backslash escapes, written "unrolled" (runs of plain characters, then one
# escape at a time) rather than as the alternation (?:[^"\\]|\\.)*: the same language, matched
# without a step per character by a backtracking engine such as Python's `re` (`LINE_PATTERN`):
# ~5x faster on a 400-character request, measured with timeit.
_QUOTED = r'"([^"\\]*(?:\\[\s\S][^"\\]*)*)"'
# A run of characters that are neither ASCII whitespace (RE2's \S; Python's \S
# also excludes Unicode spaces) nor `"`: $remote_addr and the `-` before $remote_user.
_FIELD = r'[^ "\t\n\x0B\f\r]+'
# $remote_user: whatever the client sent as its Basic-auth user name, spaces, `[`, `]` and
# timestamp-like text included; nginx escapes `"`, so it ends at the last `[$time_local]` before
# the line's first `"` (which opens $request).
_USER = r'[^"]+?'
# $time_local exactly as nginx writes it: 26 characters, e.g. 22/Nov/2026:09:57:08 +0000.
TIME_TEXT_LENGTH = 26
TIME_PATTERN = r"[0-9]{2}/[A-Z][a-z]{2}/[1-9][0-9]{3}:[0-9]{2}:[0-9]{2}:[0-9]{2} [+-][0-9]{4}"


def _prefix(ip: str, user: str, time: str) -> str:
    """The line up to and including its first `"` (which opens $request): every field the job
    counts by. No `"` but its last, so in a line of the grammar the client is the text before the
    first space and `$time_local` the TIME_TEXT_LENGTH characters before the `] "` that ends at
    the line's first `"` (what the read tasks take by position). Groups are opened by the given
    prefixes (`(` numbered, `(?:` not captured, `(?P<name>` named)."""
    return rf'^{ip}{_FIELD}) {_FIELD} {user}{_USER}) \[{time}{TIME_PATTERN})\] "'


def _tail(quoted: str, end: str) -> str:
    """The rest of the line after the prefix's `"`: $request, status, size, referer, agent."""
    field = _QUOTED.replace("(", quoted, 1)
    return field[1:] + rf" {quoted}[0-9]{{3}}) {quoted}[0-9]+|-) " + field + " " + field + end


# Python's `re`: every field a numbered group; `(?![\s\S])` is the absolute end (`$` would also
# match before a final newline).
LINE_PATTERN = _prefix("(", "(", "(") + _tail("(", r"(?![\s\S])")
GROUP_IP = 1
GROUP_TIME = 3
# RE2 (pyarrow.compute, the job's vectorised parse): whether the whole line is one, nothing
# captured (RE2 decides it with its DFA, fast at any length; `\z` is RE2's absolute end, it has
# no lookahead).
LINE_PATTERN_RE2 = _prefix("(?:", "(?:", "(?:") + _tail("(?:", r"\z")

_OCTET = r"(?:25[0-5]|2[0-4][0-9]|1[0-9][0-9]|[1-9]?[0-9])"
IPV4_PATTERN = rf"(?:{_OCTET}\.){{3}}{_OCTET}"
_H = r"[0-9a-fA-F]{1,4}"
IPV6_PATTERN = (
    r"(?:"
    rf"(?:{_H}:){{7}}{_H}"
    rf"|(?:{_H}:){{1,7}}:"
    rf"|(?:{_H}:){{1,6}}:{_H}"
    rf"|(?:{_H}:){{1,5}}(?::{_H}){{1,2}}"
    rf"|(?:{_H}:){{1,4}}(?::{_H}){{1,3}}"
    rf"|(?:{_H}:){{1,3}}(?::{_H}){{1,4}}"
    rf"|(?:{_H}:){{1,2}}(?::{_H}){{1,5}}"
    rf"|{_H}:(?::{_H}){{1,6}}"
    rf"|:(?:(?::{_H}){{1,7}}|:)"
    rf"|(?:{_H}:){{6}}{IPV4_PATTERN}"
    rf"|::(?:[fF]{{4}}(?::0{{1,4}})?:)?{IPV4_PATTERN}"
    r")"
)
IP_PATTERN = rf"^(?:{IPV4_PATTERN}|{IPV6_PATTERN})$"

_MONTHS = ("Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec")
_MONTH_NUMBER = {name: i + 1 for i, name in enumerate(_MONTHS)}
# The zone offsets nginx and java.time accept (±18:00).
_MAX_OFFSET_MINUTES = 18 * 60

# nginx's $remote_addr for a client of a unix-socket listener (`listen unix:/path`): counted
# under this key.
UNIX_CLIENT = "unix:"
# The event times that count: Spark's TimestampType range (0001-01-01T00:00:00Z to
# 9999-12-31T23:59:59Z, whole seconds as $time_local has), which Python's datetime spans too; a
# later UTC instant (year 9999 with a negative offset) is malformed, never an OverflowError.
EVENT_TIME_RANGE = (
    int(datetime(1, 1, 1, tzinfo=UTC).timestamp()) * 1000,
    int(datetime(9999, 12, 31, 23, 59, 59, tzinfo=UTC).timestamp()) * 1000,
)

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_LINE_RE = re.compile(LINE_PATTERN)
_IP_RE = re.compile(IP_PATTERN)
_TIME_RE = re.compile(TIME_PATTERN)


class ParseError(ValueError):
    """A line is not a valid nginx combined-format record (the reason says which part)."""


class TimeRangeError(ParseError):
    """A real `$time_local` whose UTC instant is outside EVENT_TIME_RANGE (Spark's timestamps)."""


@dataclass(frozen=True)
class AccessRecord:
    """One parsed access record."""

    ip: str
    event_time: datetime
    request: str
    status: int
    body_bytes: int
    referer: str
    user_agent: str
    user: str = "-"

    @property
    def event_ms(self) -> int:
        """Epoch milliseconds, in integers (no float rounding at the ends of the range)."""
        return (self.event_time - _EPOCH) // timedelta(milliseconds=1)


def _escape(value: str) -> str:
    # nginx escapes '"' and '\' (and non-printables) inside quoted fields.
    out = value.replace("\\", "\\\\").replace('"', '\\"')
    return "".join(
        ch if 32 <= ord(ch) < 127 or ord(ch) > 159 else f"\\x{ord(ch):02X}" for ch in out
    )


def format_time_local(event_ms: int, utc_offset_minutes: int = 0) -> str:
    """Render epoch milliseconds as $time_local in the given zone (second precision, like nginx)."""
    tz = timezone(timedelta(minutes=utc_offset_minutes))
    t = datetime.fromtimestamp(event_ms // 1000, tz)
    sign = "+" if utc_offset_minutes >= 0 else "-"
    off = abs(utc_offset_minutes)
    return (
        f"{t.day:02d}/{_MONTHS[t.month - 1]}/{t.year:04d}:"
        f"{t.hour:02d}:{t.minute:02d}:{t.second:02d} "
        f"{sign}{off // 60:02d}{off % 60:02d}"
    )


def format_record(
    ip: str,
    event_ms: int,
    *,
    method: str = "GET",
    path: str = "/",
    protocol: str = "HTTP/1.1",
    status: int = 200,
    body_bytes: int = 0,
    referer: str = "-",
    user_agent: str = "-",
    user: str = "-",
    utc_offset_minutes: int = 0,
) -> str:
    """Format one nginx combined-format line (no trailing newline)."""
    request = _escape(f"{method} {path} {protocol}")
    return (
        f"{ip} - {user} [{format_time_local(event_ms, utc_offset_minutes)}] "
        f'"{request}" {status} {body_bytes} "{_escape(referer)}" "{_escape(user_agent)}"'
    )


def parse_time_local(text: str) -> datetime:
    """Parse $time_local (with its zone offset) to an aware datetime in UTC, by the rules Spark's
    `to_timestamp(..., 'dd/MMM/yyyy:HH:mm:ss Z')` applies to text matching TIME_PATTERN.

    Strict: `dd/Mon/yyyy:HH:mm:ss +hhmm` exactly as nginx writes it (English month abbreviation
    with a capital, year 1000-9999, a real calendar date, 00-23 hours, no leap second, a zone
    offset within ±18:00) and its UTC instant within Spark's timestamp range (0001-01-01 to
    9999-12-31).

    Raises:
        ParseError: the text is not dd/Mon/yyyy:HH:mm:ss +hhmm, or not a real time.
        TimeRangeError: a real time whose UTC instant is outside EVENT_TIME_RANGE.
    """
    if len(text) != TIME_TEXT_LENGTH or not _TIME_RE.match(text):
        raise ParseError(f"bad time_local {text!r}: not dd/Mon/yyyy:HH:mm:ss +hhmm")
    month = _MONTH_NUMBER.get(text[3:6])
    hh, mm = int(text[22:24]), int(text[24:26])
    offset = (hh * 60 + mm) * (-1 if text[21] == "-" else 1)
    if month is None or mm >= 60 or abs(offset) > _MAX_OFFSET_MINUTES:
        raise ParseError(f"bad time_local {text!r}: unknown month or zone offset")
    try:
        local = datetime(
            int(text[7:11]),
            month,
            int(text[0:2]),
            int(text[12:14]),
            int(text[15:17]),
            int(text[18:20]),
        )
    except ValueError as exc:
        raise ParseError(f"bad time_local {text!r}: {exc}") from None
    # Naive arithmetic, not astimezone(): a local time near year 1 or 9999 whose UTC instant
    # leaves datetime's range raises OverflowError, which becomes the typed rejection here.
    try:
        utc = local - timedelta(minutes=offset)
    except OverflowError:
        raise TimeRangeError(
            f"time_local {text!r} is outside the event times that count: its UTC instant is not "
            "within 0001-01-01T00:00:00Z..9999-12-31T23:59:59Z (Spark's timestamp range)"
        ) from None
    return utc.replace(tzinfo=UTC)


def canonical_ip(ip: str) -> str:
    """The one spelling of a client IP that ipcount counts under: IPv4 as written (the pattern
    admits no leading zeros); an IPv4-mapped IPv6 address (::ffff:a.b.c.d, in any spelling) as its
    IPv4 address; any other IPv6 address in RFC 5952 form (lower case, leading zeros dropped, the
    first longest run of two or more zero groups as ::, no dotted quad); `unix:` as itself.

    Raises:
        ParseError: not an address IP_PATTERN admits.
    """
    if ip == UNIX_CLIENT:
        return ip
    if ":" not in ip:
        if not _IP_RE.match(ip):
            raise ParseError(f"bad client IP {ip!r}")
        return ip
    try:
        v6 = ipaddress.IPv6Address(ip)
    except ValueError:
        raise ParseError(f"bad client IP {ip!r}") from None
    mapped = v6.ipv4_mapped
    return str(mapped) if mapped is not None else v6.compressed


def client_ip(text: str) -> str:
    """The canonical spelling of the $remote_addr text of a line, if IP_PATTERN admits it, or
    `unix:` (UNIX_CLIENT: nginx's $remote_addr for a client of a unix-socket listener).

    Raises:
        ParseError: neither an address IP_PATTERN admits nor `unix:`.
    """
    if text == UNIX_CLIENT:
        return text
    if not _IP_RE.match(text):
        raise ParseError(f"bad client IP {text!r}")
    return canonical_ip(text)


def parse_record(line: str | bytes) -> AccessRecord:
    """Parse one line with the same rules as the Spark job. Client IPs are canonical
    (`canonical_ip`); `unix:` (a unix-socket client) is its own key. No length limit: a line nginx
    can write is counted however long its quoted fields are.

    Raises:
        ParseError: not UTF-8, not the combined format, a bad IP or a bad timestamp (whatever the
            bytes, nothing else is raised).
        TimeRangeError: a real $time_local outside EVENT_TIME_RANGE.
    """
    if isinstance(line, bytes):
        try:
            line = line.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise ParseError(f"not UTF-8: {exc}") from None
    m = _LINE_RE.match(line)
    if m is None:
        raise ParseError("not an nginx combined-format line")
    return AccessRecord(
        ip=client_ip(m.group(GROUP_IP)),
        event_time=parse_time_local(m.group(GROUP_TIME)),
        request=m.group(4),
        status=int(m.group(5)),
        body_bytes=0 if m.group(6) == "-" else int(m.group(6)),
        referer=m.group(7),
        user_agent=m.group(8),
        user=m.group(2),
    )
