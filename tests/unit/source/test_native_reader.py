"""The native reader's Python half (source.native_reader): the buffers the compiled helper fills
become the very arrays confluent-kafka's path builds, cut into the same chunks; where the helper
is not built, read tasks take the messages, and job.native_helpers=on says why at start."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given
from hypothesis import settings as hypothesis_settings
from hypothesis import strategies as st

from ipcount.config import load_settings
from ipcount.errors import ConfigError
from ipcount.source.native_reader import taken_arrays
from ipcount.source.options import parse_options, source_options
from ipcount.source.partition_reader import chunk_bounds, values_array

ROOT = Path(__file__).resolve().parents[3]


def _taken(values: list[bytes | None]) -> tuple[bytes, np.ndarray, bytes | None]:
    """What the helper's take() returns for `values`."""
    data = b"".join(v or b"" for v in values)
    ends = np.cumsum([len(v or b"") for v in values], dtype=np.int64)
    nulls = bytes(v is None for v in values) if None in values else None
    return data, ends, nulls


@hypothesis_settings(deadline=None)  # the first example imports and warms numpy and Arrow
@given(
    st.lists(st.one_of(st.none(), st.binary(max_size=300)), max_size=80),
    st.integers(min_value=1, max_value=2000),
)
def test_the_buffers_become_the_arrays_and_chunks_of_the_message_path(
    values: list[bytes | None], max_bytes: int
) -> None:
    got = taken_arrays(*_taken(values), max_bytes)
    sizes = [len(v or b"") for v in values]
    cuts = chunk_bounds(sizes, len(values), max_bytes, sum(sizes))
    assert [len(a) for a in got] == [c.stop - c.start for c in cuts]
    for array, cut in zip(got, cuts):
        array.validate(full=True)
        assert array.type == pa.binary()
        assert array.equals(values_array(values[cut]))


def test_the_native_reader_is_a_setting_the_source_options_carry() -> None:
    settings = load_settings(None, env={}, overrides=["kafka.broker_quirks=none"])
    assert settings.job.native_helpers == "auto"
    off = settings.replace("job", native_helpers="off")
    assert parse_options(source_options(off, query_checkpoint="/q")).native_helpers == "off"
    base = {"subscribe": "t", "kafka.bootstrap.servers": "127.0.0.1:9092"}
    with pytest.raises(ConfigError, match="nativeHelpers"):
        parse_options({**base, "nativeHelpers": "fast"})
    with pytest.raises(ConfigError, match="job.native_helpers must be 'auto', 'on' or 'off'"):
        load_settings(None, env={}, overrides=["job.native_helpers=fast"])


_NOT_BUILT = """
import importlib.abc, sys

class NotBuilt(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name in ("ipcount.source._fastread", "ipcount.formats._prefix_scan"):
            raise ModuleNotFoundError(f"No module named {name!r}")
        return None

sys.meta_path.insert(0, NotBuilt())
from ipcount.errors import ConfigError
from ipcount.source.native_reader import check_read_path, uses_native_reader
from ipcount.source.options import parse_options

print(check_read_path("auto"))
opts = parse_options({"subscribe": "t", "kafka.bootstrap.servers": "h:1", "nativeHelpers": "auto"})
print(uses_native_reader(opts))
try:
    check_read_path("on")
except ConfigError as exc:
    print(exc)
"""


def test_without_the_helper_tasks_take_the_messages_and_on_says_why() -> None:
    done = subprocess.run(
        [sys.executable, "-c", _NOT_BUILT], cwd=ROOT, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr[-3000:]
    auto, uses, on = done.stdout.strip().splitlines()
    assert auto.startswith("confluent-kafka's messages (the native reader is not built")
    assert "C compiler" in auto
    assert auto.endswith(
        "with Arrow's kernels (the prefix scan is not built (No module named "
        "'ipcount.formats._prefix_scan'))"
    )
    assert uses == "False"
    assert on.startswith("job.native_helpers=on: the prefix scan is not built")
