"""The Python parser on hostile lines: the rules it shares with the read tasks' vectorised parse
(see tests/unit/formats/test_parse_parity.py), spelled out case by case."""

from __future__ import annotations

import pytest

from ipcount.formats.accesslog import (
    ParseError,
    canonical_ip,
    format_record,
    parse_record,
    parse_time_local,
)

MS = 1_795_341_600_000
OK = '1.2.3.4 - {user} [22/Nov/2026:09:57:08 +0000] "GET / HTTP/1.1" 200 1 "-" "-"'


def test_a_bracket_in_remote_user_does_not_hide_the_time() -> None:
    # nginx does not escape $remote_user, which the client controls (HTTP Basic auth).
    rec = parse_record(OK.format(user="a]b[c"))
    assert rec.user == "a]b[c" and rec.event_ms == 1_795_341_428_000


@pytest.mark.parametrize(
    "line",
    [
        OK.format(user="-") + "\n",  # a trailing newline: both regex engines would allow it at $
        OK.format(user="-") + "\u2028",
        OK.format(user="-").replace(" 200 ", " ٢٠٠ "),  # Unicode digits
        OK.format(user="-").replace("Nov", "nov"),
        OK.format(user="-").replace("2026", "0999"),
    ],
)
def test_lines_both_parsers_reject(line: str) -> None:
    with pytest.raises(ParseError):
        parse_record(line)


def test_unicode_space_inside_a_field_is_part_of_it() -> None:
    assert parse_record(OK.format(user="a\u00a0b")).user == "a\u00a0b"


@pytest.mark.parametrize(
    "user", ["a\u00a0b c", "evil] [01/Jan/2000:00:00:00 +0000]", " ", "x [y] z", "]"]
)
def test_remote_user_may_hold_spaces_brackets_and_a_fake_time(user: str) -> None:
    # A client's Basic-auth user name, logged by nginx unescaped: the line is a real request.
    rec = parse_record(OK.format(user=user))
    assert rec.user == user and rec.ip == "1.2.3.4"
    assert rec.event_time.isoformat() == "2026-11-22T09:57:08+00:00"


def test_escapes_in_quoted_fields() -> None:
    line = format_record("1.2.3.4", MS, user_agent='say "hi" \\ \u2028 \x22')
    rec = parse_record(line)
    assert rec.ip == "1.2.3.4" and rec.event_ms == MS


@pytest.mark.parametrize(
    ("text", "ok"),
    [
        ("29/Feb/2024:00:00:00 +0000", True),
        ("29/Feb/2023:00:00:00 +0000", False),
        ("31/Nov/2026:00:00:00 +0000", False),
        ("01/Jan/2026:24:00:00 +0000", False),
        ("01/Jan/2026:23:59:60 +0000", False),
        ("01/Jan/2026:00:00:00 +1800", True),
        ("01/Jan/2026:00:00:00 -1800", True),
        ("01/Jan/2026:00:00:00 +1801", False),
        ("01/Jan/2026:00:00:00 +0060", False),
        ("01/Sept/2026:00:00:00 +0000", False),
    ],
)
def test_time_local_rules(text: str, ok: bool) -> None:
    if ok:
        parse_time_local(text)
    else:
        with pytest.raises(ParseError):
            parse_time_local(text)


@pytest.mark.parametrize(
    ("ip", "canonical"),
    [
        ("203.0.113.9", "203.0.113.9"),
        ("::ffff:203.0.113.9", "203.0.113.9"),
        ("::FFFF:203.0.113.9", "203.0.113.9"),
        ("0:0:0:0:0:ffff:cb00:7109", "203.0.113.9"),
        ("2001:DB8::1", "2001:db8::1"),
        ("2001:0db8:0000:0000:0000:0000:0000:0001", "2001:db8::1"),
        ("2001:db8:0:0:1:0:0:1", "2001:db8::1:0:0:1"),  # the first of two longest runs
        ("2001:db8:0:1:1:1:1:1", "2001:db8:0:1:1:1:1:1"),  # a single zero group stays
        ("64:FF9B::102:304", "64:ff9b::102:304"),  # only mapped addresses become IPv4
        ("::", "::"),
    ],
)
def test_canonical_ip(ip: str, canonical: str) -> None:
    assert canonical_ip(ip) == canonical
    assert parse_record(format_record(ip, MS)).ip == canonical
