"""A counting read task's values straight from librdkafka into Arrow buffers (executor side).

confluent-kafka's `consume()` builds one `Message` object per record and the task then asks each
for its value; the compiled helper `ipcount.source._fastread` (built by `pip install` where a C
compiler is found, see setup.py) takes the same records from the same consumer's partition fetch
queue and copies each value into one data buffer, beside its end offset: the binary array's own
buffers. Everything else of a range read is `partition_reader`'s: the consumer and its settings,
the position that passes control records, the data-loss handling and the no-progress timeout.

`read_values` picks the path: the helper where it is built and the source option nativeHelpers
is `auto` or `on` (`on` fails when it is missing), else `partition_reader.read_chunks`. Both give
the same arrays (tests/integration/source/test_native_reads.py).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator
from types import ModuleType

import confluent_kafka
import numpy as np
import pyarrow as pa
from confluent_kafka import Consumer, KafkaError, TopicPartition

from ipcount.errors import ConfigError
from ipcount.formats.arrow_parse import PREFIX_SCAN_MISSING
from ipcount.source.consumer import CONSUME_TIMEOUT_S, new_consumer
from ipcount.source.offsets import OffsetRange
from ipcount.source.options import SourceOptions
from ipcount.source.partition_reader import (
    BATCH_ROWS,
    MAX_BINARY_BYTES,
    ReadState,
    after_read_error,
    chunk_bounds,
    chunk_values,
    follow_position,
    read_chunks,
    values_array,
)

__all__ = [
    "check_read_path",
    "native_helper",
    "read_values",
    "taken_arrays",
    "uses_native_reader",
]

logger = logging.getLogger(__name__)

_CONSUME_TIMEOUT_MS = int(CONSUME_TIMEOUT_S * 1000)
# The helper, loaded once per process (None: not built or not usable; _why says why).
_helper: ModuleType | None = None
_why: str | None = None


def _librdkafka_path() -> str | None:
    """The file of the librdkafka that confluent-kafka loaded into this process."""
    import confluent_kafka.cimpl  # noqa: F401  (loads librdkafka)

    try:
        with open("/proc/self/maps", encoding="utf-8", errors="replace") as maps:
            for line in maps:
                path = line.rstrip("\n").split(maxsplit=5)[-1]
                if "librdkafka" in path.rsplit("/", 1)[-1] and path.startswith("/"):
                    return path
    except OSError:
        return None
    return None


def native_helper() -> ModuleType | None:
    """The compiled helper, ready to read (None where it is not built or cannot be used: the
    reason is logged once per process)."""
    global _helper, _why
    if _helper is not None or _why is not None:
        return _helper
    try:
        from ipcount.source import _fastread  # type: ignore[attr-defined]
    except ImportError as exc:
        _why = f"not built ({exc}): reinstall ipcount where a C compiler is found"
    else:
        path = _librdkafka_path()
        version = str(confluent_kafka.__version__)
        if not version.startswith("2."):
            # The helper reads the Consumer's librdkafka handle where confluent-kafka 2.x has it.
            _why = f"not for confluent-kafka {version} (it knows 2.x)"
        elif path is None:
            _why = "librdkafka's file was not found among the process's libraries"
        else:
            try:
                _fastread.load(path)
                _helper = _fastread
            except OSError as exc:
                _why = str(exc)
    if _why is not None:
        logger.info("read tasks use confluent-kafka's messages: the native reader is %s", _why)
    return _helper


def _native(mode: str, name: str) -> bool:
    if mode == "off":
        return False
    if native_helper() is not None:
        return True
    if mode == "on":
        raise ConfigError(f"{name}=on: the native reader is {_why}")
    return False


def uses_native_reader(options: SourceOptions) -> bool:
    """Whether a counting read task of these options reads through the compiled helper.

    Raises:
        ConfigError: nativeHelpers=on where the helper is not built.
    """
    return _native(options.native_helpers, "option nativeHelpers")


def check_read_path(mode: str) -> str:
    """The driver's check at a job's start: how its counting read tasks will read and cut their
    lines (a phrase for the log), where the executors run this install (local mode, or nodes with
    the same one).

    Raises:
        ConfigError: job.native_helpers=on where a compiled helper is not built.
    """
    if mode == "off":
        return "confluent-kafka's messages and Arrow's kernels (job.native_helpers=off)"
    if mode == "on" and PREFIX_SCAN_MISSING is not None:
        raise ConfigError(f"job.native_helpers=on: the prefix scan is {PREFIX_SCAN_MISSING}")
    reader = (
        "the native reader (record values straight into Arrow buffers)"
        if _native(mode, "job.native_helpers")
        else f"confluent-kafka's messages (the native reader is {_why})"
    )
    scan = (
        "the compiled prefix scan"
        if PREFIX_SCAN_MISSING is None
        else f"Arrow's kernels (the prefix scan is {PREFIX_SCAN_MISSING})"
    )
    return f"{reader}, checking lines and cutting clients and times with {scan}"


def read_values(
    options: SourceOptions,
    rng: OffsetRange,
    on_lost: Callable[[int], None] | None = None,
    batch_rows: int = BATCH_ROWS,
) -> Iterator[pa.Array]:
    """Read offsets [rng.start, rng.end) of one partition as Arrow binary arrays of the record
    values, in chunks as `partition_reader.read_chunks(..., chunk_values)` cuts them, through the
    compiled helper where `uses_native_reader`; see read_chunks for what raises."""
    helper = native_helper() if uses_native_reader(options) else None
    if helper is None:
        yield from read_chunks(options, rng, chunk_values, batch_rows, on_lost)
        return
    conf = options.consumer_conf("executor")
    consumer = new_consumer(conf)
    try:
        queue = helper.PartitionQueue(consumer, rng.topic, rng.partition, conf["client.id"])
    except RuntimeError as exc:
        # The consumer's handle is not where the helper reads it: the helper is given up for this
        # process, and the read goes the way any read without it goes (nativeHelpers=on: fails).
        consumer.close()
        _give_up(f"unusable with this confluent-kafka: {exc}")
        yield from read_values(options, rng, on_lost, batch_rows)
        return
    try:
        # The queue is the application's before the assignment starts fetching into it.
        consumer.assign([TopicPartition(rng.topic, rng.partition, rng.start)])
        state = ReadState(rng.start, on_lost)
        while state.pos < rng.end:
            yield from _next_arrays(queue, consumer, options, rng, batch_rows, state)
    finally:
        queue.close()
        consumer.close()


def _give_up(reason: str) -> None:
    """The helper failed its check on a live consumer: this process's later reads decide as
    where it is not built (native_helper() is None from now on)."""
    global _helper, _why
    _helper, _why = None, reason
    logger.warning("the native reader is given up in this process: %s", reason)


def _next_arrays(
    queue: object,
    consumer: Consumer,
    options: SourceOptions,
    rng: OffsetRange,
    batch_rows: int,
    st: ReadState,
) -> list[pa.Array]:
    """partition_reader._next_batch through the helper: consume until `batch_rows` records or
    options.max_bytes_per_batch value bytes are pending, or the range ends; the pending values
    as arrays of chunks cut by `chunk_bounds`."""
    end, max_bytes = rng.end, options.max_bytes_per_batch
    pending = pending_bytes = 0
    while st.pos < end:
        want = max(1, min(batch_rows - pending, end - st.pos))
        returned, pending, pending_bytes, last, code, text = queue.consume(  # type: ignore[attr-defined]
            want, _CONSUME_TIMEOUT_MS, end
        )
        if last >= 0:
            # Records before an error event are valid; those at or past the end were dropped.
            st.pos = max(st.pos, last + 1)
            st.last_progress = time.monotonic()
        if code:
            after_read_error(consumer, options, rng, st, KafkaError(code, text))
            continue
        if returned and (pending >= batch_rows or pending_bytes >= max_bytes):
            break
        follow_position(consumer, options, rng, st)
    data, ends, nulls = queue.take()  # type: ignore[attr-defined]
    return taken_arrays(data, np.frombuffer(ends, dtype=np.int64), nulls, max_bytes)


def taken_arrays(
    data: bytes, ends: np.ndarray, nulls: bytes | None, max_bytes: int
) -> list[pa.Array]:
    """What the helper's take() gave (the values end to end, each one's end offset, a null flag
    per record or None) as binary arrays of the chunks `chunk_bounds` cuts them into: zero-copy
    views of `data`."""
    n = len(ends)
    if not n:
        return []
    starts = np.empty(n, dtype=np.int64)
    starts[0] = 0
    starts[1:] = ends[:-1]
    total = int(ends[-1])
    sizes = ends - starts
    cuts = chunk_bounds(sizes.tolist() if total > max_bytes else (), n, max_bytes, total)
    buffer = pa.py_buffer(data)
    flags = np.frombuffer(nulls, dtype=np.bool_) if nulls is not None else None
    out = []
    for cut in cuts:
        first, count = cut.start, cut.stop - cut.start
        base, top = int(starts[first]), int(ends[cut.stop - 1])
        if top - base > MAX_BINARY_BYTES:
            # Past what int32 offsets address: as partition_reader.values_array does it.
            nulls_of = flags[cut] if flags is not None else np.zeros(count, dtype=np.bool_)
            spans = zip(starts[cut].tolist(), ends[cut].tolist(), nulls_of.tolist())
            out.append(values_array([None if null else data[a:b] for a, b, null in spans]))
            continue
        offsets = np.empty(count + 1, dtype=np.int32)
        offsets[0] = 0
        offsets[1:] = ends[cut] - base
        validity = None
        null_count = 0
        if flags is not None and flags[cut].any():
            valid = ~flags[cut]
            null_count = int(count - valid.sum())
            validity = pa.py_buffer(np.packbits(valid, bitorder="little"))
        out.append(
            pa.Array.from_buffers(
                pa.binary(),
                count,
                [validity, pa.py_buffer(offsets), buffer.slice(base, top - base)],
                null_count=null_count,
            )
        )
    return out
