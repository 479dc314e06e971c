"""The access-log format round-trips; the ledger saves, loads and merges."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

import pytest

from ipcount.errors import ConfigError
from ipcount.formats.accesslog import (
    ParseError,
    canonical_ip,
    format_record,
    format_time_local,
    parse_record,
)
from ipcount.verify.ledger import Ledger, window_start_ms


@pytest.mark.parametrize(
    "ip",
    [
        "1.2.3.4",
        "255.255.255.255",
        "0.0.0.0",
        "2001:db8::1",
        "::1",
        "fe80::1:2:3:4",
        "::ffff:10.0.0.1",
    ],
)
def test_round_trip(ip: str) -> None:
    ms = 1_795_341_600_000
    line = format_record(
        ip, ms, method="POST", path='/a "q"', status=201, body_bytes=12, user_agent="ua\\x"
    )
    rec = parse_record(line)
    assert rec.ip == canonical_ip(ip)
    assert rec.event_ms == ms
    assert rec.status == 201
    assert rec.body_bytes == 12


def test_zone_offset_is_applied() -> None:
    ms = 1_795_341_600_000
    assert format_time_local(ms, -300).endswith("-0500")
    rec = parse_record(format_record("1.1.1.1", ms, utc_offset_minutes=-300))
    assert rec.event_time == datetime.fromtimestamp(ms / 1000, UTC)


@pytest.mark.parametrize(
    ("line", "why"),
    [
        ("garbage", "not an nginx"),
        (
            '999.1.1.1 - - [22/Nov/2026:09:57:08 +0000] "GET / HTTP/1.1" 200 1 "-" "-"',
            "bad client IP",
        ),
        (
            '1.1.1.1 - - [32/Nov/2026:09:57:08 +0000] "GET / HTTP/1.1" 200 1 "-" "-"',
            "bad time_local",
        ),
        ('1:2:3 - - [22/Nov/2026:09:57:08 +0000] "GET / HTTP/1.1" 200 1 "-" "-"', "bad client IP"),
        (
            b'1.1.1.1 - - [22/Nov/2026:09:57:08 +0000] "GET /\xff HTTP/1.1" 200 1 "-" "-"',
            "not UTF-8",
        ),
    ],
)
def test_malformed(line: str | bytes, why: str) -> None:
    with pytest.raises(ParseError, match=why):
        parse_record(line)


def test_window_boundaries() -> None:
    assert window_start_ms(4999, 5000) == 0
    assert (
        window_start_ms(5000, 5000) == 5000
    )  # an event at exactly the end belongs to the next window


def test_ledger_save_load_merge(tmp_path: Path) -> None:
    a = Ledger()
    a.add(5001, "1.2.3.4")
    a.add(9999, "1.2.3.4")
    a.add_late(1000, "::1")
    a.add_malformed(2)
    a.save(tmp_path / "a.jsonl")
    b = Ledger.load_all([tmp_path / "a.jsonl", tmp_path / "a.jsonl"])
    assert b.counts == {(5000, "1.2.3.4"): 4}
    assert b.late_counts == {(0, "::1"): 2}
    assert (b.on_time, b.late, b.malformed, b.records) == (4, 2, 4, 10)


def test_ledger_errors(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="does not exist"):
        Ledger.load(tmp_path / "nope")
    (tmp_path / "x").write_text('{"a": 1}\n')
    with pytest.raises(ConfigError, match="is not an ipcount ledger"):
        Ledger.load(tmp_path / "x")
    with pytest.raises(ConfigError, match="cannot merge"):
        Ledger(window_ms=5000).merge(Ledger(window_ms=1000))
