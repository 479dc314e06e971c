"""The JVM-side parser agrees with the Python parser (the one loadgen and tests use) on every line."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from ipcount.formats.accesslog import ParseError, format_record, parse_record
from ipcount.job.parse import parse_access_records
from ipcount.source.reader import SCHEMA

MS = 1_795_341_600_000

LINES: list[bytes] = [
    format_record("1.2.3.4", MS).encode(),
    format_record("10.0.0.255", MS + 4_999).encode(),
    format_record("2001:DB8::1", MS + 5_000, utc_offset_minutes=120).encode(),
    format_record("::ffff:10.0.0.1", MS, user_agent='Mozilla "x" \\ y').encode(),
    format_record("fe80::1:2:3:4", MS, utc_offset_minutes=-330, status=404, body_bytes=0).encode(),
    b"garbage",
    b"",
    format_record("999.1.1.1", MS).encode(),
    format_record("1.2.3", MS).encode(),
    format_record("1:2:3", MS).encode(),
    b'1.1.1.1 - - [32/Nov/2026:09:57:08 +0000] "GET / HTTP/1.1" 200 1 "-" "-"',
    b'1.1.1.1 - - [22/Nov/2026:09:57:08] "GET / HTTP/1.1" 200 1 "-" "-"',
    b'1.1.1.1 - - [22/Nov/2026:09:57:08 +0000] "GET /\xff\xfe HTTP/1.1" 200 1 "-" "-"',
    format_record("1.1.1.1", MS, path="/" + "a" * 9000).encode(),
    format_record("1.1.1.1", MS).encode()[:-5],
]


def _python_verdict(line: bytes) -> tuple[str | None, int | None]:
    if len(line) > 8192:
        return None, None
    try:
        rec = parse_record(line)
    except ParseError:
        return None, None
    return rec.ip, rec.event_ms


def test_spark_parser_matches_python_parser(spark) -> None:  # type: ignore[no-untyped-def]
    hb_time = datetime.fromtimestamp(MS / 1000 + 60, UTC)
    rows = [(None, line, "t", 0, i, hb_time, 0, False, None) for i, line in enumerate(LINES)]
    rows.append((None, None, None, -1, len(LINES), hb_time, -1, True, None))
    df = spark.createDataFrame(rows, SCHEMA)
    out = {r["offset"]: r for r in parse_access_records(df, 8192).collect()}
    for i, line in enumerate(LINES):
        ip, event_ms = _python_verdict(line)
        row = out[i]
        assert row["malformed"] is (ip is None), (line[:80], row)
        assert row["ip"] == ip, line[:80]
        got_ms = None if row["event_time"] is None else int(row["event_time"].timestamp() * 1000)
        assert got_ms == event_ms, line[:80]
    hb = out[len(LINES)]
    assert hb["heartbeat"] is True and hb["malformed"] is False
    assert hb["event_time"].timestamp() == pytest.approx(hb_time.timestamp())
