"""The native reader (issue #42): a counting read task takes its records' values from librdkafka
straight into Arrow buffers, and gives exactly the arrays confluent-kafka's Message path gives,
in the same order and within the same chunk bounds, on a real broker: null, empty, binary and 900 KiB values, ranges that end before
the log does, aborted transactions and their control records, and offsets deleted before they
were read."""

from __future__ import annotations

import os
import uuid
from collections.abc import Callable
from typing import Any

import pyarrow as pa
import pytest
from confluent_kafka import Producer, TopicPartition
from confluent_kafka.admin import AdminClient

from ipcount.errors import ConfigError, DataLossError
from ipcount.kafka.client import with_client_logging
from ipcount.source import native_reader
from ipcount.source.native_reader import native_helper, read_values
from ipcount.source.offsets import OffsetRange
from ipcount.source.options import parse_options

pytestmark = pytest.mark.kafka

LINE = (
    b'203.0.113.7 - - [01/Jan/2026:00:00:00 +0000] "GET /index.html HTTP/1.1" 200 512 "-" '
    b'"Mozilla/5.0 (X11; Linux x86_64)"'
)
HOSTILE: list[bytes | None] = [
    LINE,
    b"",
    None,
    b"\xff\xfe\x00not utf-8\x00",
    LINE.replace(b"203.0.113.7", b"::ffff:203.0.113.7"),
    b"x" * (900 * 1024),  # under the broker's default message.max.bytes
    None,
    LINE + b" " + b"A" * 6000,
]


@pytest.fixture(autouse=True)
def _helper_built() -> None:
    # CI builds the helper (`pip install -e .` with gcc): there it must be there, not skipped.
    if native_helper() is None:
        if os.environ.get("CI") == "true":
            pytest.fail(f"the native reader is not built: {native_reader._why}")
        pytest.skip(f"the native reader is not built: {native_reader._why}")


def _options(bootstrap: str, topic: str, mode: str, **extra: str) -> Any:
    return parse_options(
        {"subscribe": topic, "kafka.bootstrap.servers": bootstrap, "nativeHelpers": mode, **extra}
    )


def _read_both(
    bootstrap: str, rng: OffsetRange, batch_rows: int = 50_000, **extra: str
) -> tuple[list[pa.Array], list[pa.Array], list[int], list[int]]:
    lost: dict[str, list[int]] = {"on": [], "off": []}
    out = {
        mode: list(
            read_values(
                _options(bootstrap, rng.topic, mode, **extra),
                rng,
                on_lost=lost[mode].append,
                batch_rows=batch_rows,
            )
        )
        for mode in ("on", "off")
    }
    return out["on"], out["off"], lost["on"], lost["off"]


def _assert_same(
    native: list[pa.Array], python: list[pa.Array], batch_rows: int, max_bytes: int
) -> None:
    # Where a chunk ends depends on what each consume call found queued (on both paths); what
    # they hold, in order, and the bounds every chunk keeps do not.
    for chunks in (native, python):
        for a in chunks:
            assert a.type == pa.binary()
            a.validate(full=True)
            assert 0 < len(a) <= batch_rows
            assert len(a) == 1 or sum(len(v or b"") for v in a.to_pylist()) <= max_bytes
    a, b = pa.concat_arrays(native), pa.concat_arrays(python)
    assert a.null_count == b.null_count
    assert a.equals(b)


def test_hostile_values_read_the_same_as_through_messages(
    bootstrap: str, topic_with: Callable[[list[Any]], str]
) -> None:
    values = HOSTILE * 40 + [LINE] * 3000
    topic = topic_with(values)
    # From the middle to short of the end: records past the range's end must be left out.
    rng = OffsetRange(topic, 0, 5, len(values) - 7)
    native, python, _, _ = _read_both(bootstrap, rng, batch_rows=700)
    _assert_same(native, python, 700, 16 * 1024 * 1024)
    assert sum(len(a) for a in native) == rng.end - rng.start
    assert pa.concat_arrays(native).to_pylist() == values[rng.start : rng.end]


def test_chunks_are_cut_by_bytes_as_through_messages(
    bootstrap: str, topic_with: Callable[[list[Any]], str]
) -> None:
    # maxBytesPerBatch smaller than one 900 KiB value: it is a chunk alone, the rest cut by bytes.
    values = HOSTILE * 6
    topic = topic_with(values)
    native, python, _, _ = _read_both(
        bootstrap, OffsetRange(topic, 0, 0, len(values)), maxBytesPerBatch="20000"
    )
    _assert_same(native, python, 50_000, 20_000)
    assert len(native) > 6


def test_aborted_transactions_and_control_records_are_passed_over(bootstrap: str) -> None:
    topic = _new_topic(bootstrap)
    producer = Producer(
        with_client_logging(
            {"bootstrap.servers": bootstrap, "transactional.id": f"tx-{uuid.uuid4().hex[:8]}"}
        )
    )
    producer.init_transactions(30)
    expected: list[bytes] = []
    for txn in range(6):
        producer.begin_transaction()
        batch = [b"%d-%d " % (txn, i) + LINE for i in range(500)]
        for value in batch:
            producer.produce(topic, value=value, partition=0)
        producer.flush(30)
        if txn % 2:
            producer.abort_transaction(30)
        else:
            producer.commit_transaction(30)
            expected.extend(batch)
    end = _high_watermark(bootstrap, topic)  # the last offset is a commit marker
    native, python, _, _ = _read_both(bootstrap, OffsetRange(topic, 0, 0, end), batch_rows=400)
    _assert_same(native, python, 400, 16 * 1024 * 1024)
    assert pa.concat_arrays(native).to_pylist() == expected


def test_deleted_offsets_are_lost_alike(
    bootstrap: str, topic_with: Callable[[list[Any]], str]
) -> None:
    values = [b"%d " % i + LINE for i in range(2000)]
    topic = topic_with(values)
    admin = AdminClient(with_client_logging({"bootstrap.servers": bootstrap}))
    for fut in admin.delete_records([TopicPartition(topic, 0, 1200)]).values():
        fut.result(timeout=30)
    rng = OffsetRange(topic, 0, 100, 1900)
    native, python, lost_native, lost_python = _read_both(bootstrap, rng, failOnDataLoss="false")
    _assert_same(native, python, 50_000, 16 * 1024 * 1024)
    assert lost_native == lost_python == [1100]
    assert pa.concat_arrays(native).to_pylist() == values[1200:1900]
    with pytest.raises(DataLossError):
        list(read_values(_options(bootstrap, topic, "on"), rng))


def _new_topic(bootstrap: str) -> str:
    from confluent_kafka.admin import NewTopic

    name = f"src-{uuid.uuid4().hex[:10]}"
    admin = AdminClient(with_client_logging({"bootstrap.servers": bootstrap}))
    for fut in admin.create_topics([NewTopic(name, 1, 1)]).values():
        fut.result(timeout=30)
    return name


def _high_watermark(bootstrap: str, topic: str) -> int:
    from confluent_kafka import Consumer

    consumer = Consumer(with_client_logging({"bootstrap.servers": bootstrap, "group.id": "hw"}))
    try:
        return int(consumer.get_watermark_offsets(TopicPartition(topic, 0), timeout=30)[1])
    finally:
        consumer.close()


def test_a_handle_the_helper_does_not_recognise_falls_back_to_messages(
    bootstrap: str,
    topic_with: Callable[[list[Any]], str],
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    # The helper's own check on the consumer's handle, made to fail as it does where
    # confluent-kafka keeps the handle elsewhere: the name it reads is not the expected one.
    helper = native_helper()
    assert helper is not None
    built = helper.PartitionQueue

    def elsewhere(consumer: Any, topic: str, partition: int, client_id: str) -> Any:
        return built(consumer, topic, partition, client_id + "-elsewhere")

    monkeypatch.setattr(helper, "PartitionQueue", elsewhere)
    monkeypatch.setattr(native_reader, "_helper", helper)
    monkeypatch.setattr(native_reader, "_why", None)
    values = HOSTILE * 5 + [LINE] * 500
    topic = topic_with(values)
    rng = OffsetRange(topic, 0, 0, len(values))
    with caplog.at_level("WARNING", logger=native_reader.__name__):
        auto = list(read_values(_options(bootstrap, topic, "auto"), rng))
    assert pa.concat_arrays(auto).to_pylist() == values
    assert "not where this module expects it" in caplog.text
    # The rest of the process's tasks read messages without trying again; `on` says why.
    assert native_helper() is None
    again = list(read_values(_options(bootstrap, topic, "auto"), rng))
    assert pa.concat_arrays(again).to_pylist() == values
    monkeypatch.setattr(native_reader, "_helper", helper)
    monkeypatch.setattr(native_reader, "_why", None)
    with pytest.raises(ConfigError, match="nativeHelpers=on.*expects it"):
        list(read_values(_options(bootstrap, topic, "on"), rng))
