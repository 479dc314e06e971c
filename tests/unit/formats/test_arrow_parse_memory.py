"""A read task's parser remembers a bounded amount, whatever the records hold: rejected client
texts longer than any IP are not remembered, and what it remembers is bounded in entries
(issue #38: four 16 MB chunks of unique 16 KB junk addresses kept ~106 MB)."""

from __future__ import annotations

import gc
import tracemalloc

import pyarrow as pa

from ipcount.formats.accesslog import format_record
from ipcount.formats.arrow_parse import BAD_IP, OK, ChunkParser

T0 = 1_767_225_600_000  # 2026-01-01T00:00:00Z


def _kept_bytes(parser: ChunkParser, chunks: list[list[str]]) -> int:
    """Python memory still held after parsing `chunks` (each dropped once parsed)."""
    parser.parse(pa.array([format_record("junk", T0).encode()], pa.binary()))  # lazy imports
    gc.collect()
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        for addresses in chunks:
            values = pa.array([format_record(a, T0).encode() for a in addresses], pa.binary())
            parsed = parser.parse(values)
            assert (parsed.verdict == BAD_IP).all()
            del values, parsed
        gc.collect()
        return tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()


def test_long_junk_addresses_are_not_remembered() -> None:
    parser = ChunkParser()
    # 4 chunks of 100 unique 16 KB addresses: 6.5 MB of junk in all.
    chunks = [[f"{c}-{i}-" + "x" * 16_384 for i in range(100)] for c in range(4)]
    kept = _kept_bytes(parser, chunks)
    assert kept < 500_000, f"the parser kept {kept:,} bytes of 6.5 MB of junk addresses"


def test_short_junk_addresses_are_remembered_up_to_a_bound() -> None:
    parser = ChunkParser()
    # 60,000 unique junk addresses of at most 45 characters (the longest IP text's length).
    chunks = [[f"junk.{c}.{i:06d}.{'y' * 20}" for i in range(10_000)] for c in range(6)]
    assert max(len(a) for chunk in chunks for a in chunk) <= 45
    kept = _kept_bytes(parser, chunks)
    assert kept < 2_000_000, f"the parser kept {kept:,} bytes for 60,000 junk addresses"


def test_the_longest_ip_texts_still_count() -> None:
    parser = ChunkParser()
    longest = "ffff:ffff:ffff:ffff:ffff:ffff:255.255.255.255"
    assert len(longest) == 45
    values = [format_record(ip, T0).encode() for ip in (longest, "::ffff:1.2.3.4", "unix:")]
    parsed = parser.parse(pa.array(values, pa.binary()))
    assert (parsed.verdict == OK).all()
    assert parsed.ips == ["ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff", "1.2.3.4", "unix:"]
