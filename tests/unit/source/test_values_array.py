"""A read task's values as an Arrow array (source.partition_reader.values_array): the very array
Arrow builds from the Python values, whatever they hold, built from one join instead."""

from __future__ import annotations

import pyarrow as pa
from hypothesis import given
from hypothesis import strategies as st

from ipcount.formats.accesslog import format_record
from ipcount.formats.arrow_parse import NO_VALUE, OK, ChunkParser
from ipcount.source.partition_reader import values_array


@given(st.lists(st.one_of(st.none(), st.binary(max_size=300)), max_size=60))
def test_the_same_array_arrow_builds_for_any_values(values: list[bytes | None]) -> None:
    got = values_array(values)
    got.validate(full=True)
    assert got.type == pa.binary()
    assert got.equals(pa.array(values, pa.binary()))


def test_empty_values_and_a_tombstone_keep_their_verdicts() -> None:
    line = format_record("10.0.0.1", 1_700_000_000_000).encode()
    for chunk in ([line, b"", line], [line, None, line]):
        parsed = ChunkParser().parse(values_array(chunk))
        middle = int(parsed.verdict[1])
        assert [int(v) for v in parsed.verdict[::2]] == [OK, OK]
        assert middle != OK and (middle == NO_VALUE) == (chunk[1] is None)
