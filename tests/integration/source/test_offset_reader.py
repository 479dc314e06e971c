"""Kafka source against the real broker without Spark: driver planning, data loss, executor reads."""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Iterator

import pyarrow as pa
import pytest
from confluent_kafka import Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic
from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadMaxRows

from ipcount.errors import DataLossError, SourceError
from ipcount.kafka.client import with_client_logging
from ipcount.source.data_source import KafkaDataSource
from ipcount.source.offsets import OffsetRange
from ipcount.source.reader import KafkaInputPartition, KafkaStreamReader
from ipcount.source.schema import SCHEMA

BASE_MS = 1_700_000_000_000


def _topic(bootstrap: str, partitions: int) -> str:
    name = f"srcdrv-{uuid.uuid4().hex[:10]}"
    admin = AdminClient(with_client_logging({"bootstrap.servers": bootstrap}))
    new = NewTopic(
        name, num_partitions=partitions, replication_factor=1, config={"retention.ms": "-1"}
    )
    for fut in admin.create_topics([new]).values():
        fut.result(timeout=30)
    return name


def _produce(bootstrap: str, topic: str, partition: int, count: int, first: int = 0) -> None:
    producer = Producer(with_client_logging({"bootstrap.servers": bootstrap, "linger.ms": 5}))
    for i in range(first, first + count):
        producer.produce(
            topic, key=b"k%d" % i, value=b"v%d" % i, partition=partition, timestamp=BASE_MS + i
        )
    assert producer.flush(30) == 0


def _reader(bootstrap: str, topic: str, **options: str) -> KafkaStreamReader:
    opts = {"kafka.bootstrap.servers": bootstrap, "subscribe": topic, **options}
    reader = KafkaDataSource(opts).streamReader(SCHEMA)
    assert isinstance(reader, KafkaStreamReader)
    return reader


def _offsets(topic: str, **by_partition: int) -> dict:
    return {"offsets": {topic: {p.lstrip("p"): o for p, o in by_partition.items()}}}


def _rows(batches: Iterator[pa.RecordBatch]) -> list[dict]:
    return [row for batch in batches for row in batch.to_pylist()]


def test_planning_limits_lag_report_and_available_now_target(bootstrap: str) -> None:
    topic = _topic(bootstrap, 2)
    _produce(bootstrap, topic, 0, 30)
    _produce(bootstrap, topic, 1, 10, first=100)
    reader = _reader(
        bootstrap, topic, startingOffsets="earliest", maxOffsetsPerTrigger="8", minPartitions="4"
    )
    try:
        start = reader.initialOffset()
        assert start == _offsets(topic, p0=0, p1=0)
        assert reader.getDefaultReadLimit() == ReadMaxRows(8)
        end = reader.latestOffset(start, ReadMaxRows(8))
        # Lags 30 and 10 share 8 offsets: 6 and 2.
        assert end == _offsets(topic, p0=6, p1=2)
        report = reader.reportLatestOffset()
        assert report is not None
        assert report["offsets"] == {topic: {"0": 30, "1": 10}} and report["totalLag"] == 32
        parts = reader.partitions(start, end)
        assert all(isinstance(p, KafkaInputPartition) for p in parts)
        assert sorted((p.range.partition, p.range.start, p.range.end) for p in parts) == [
            (0, 0, 2),
            (0, 2, 4),
            (0, 4, 6),
            (1, 0, 2),
        ]
        # The engine may ask for everything regardless of the option (e.g. Trigger.Once).
        assert reader.latestOffset(start, ReadAllAvailable()) == _offsets(topic, p0=30, p1=10)
        # AvailableNow: the target is fixed when the run starts; later records wait.
        reader.prepareForTriggerAvailableNow()
        _produce(bootstrap, topic, 0, 5, first=30)
        everything = reader.latestOffset(end, ReadAllAvailable())
        assert everything == _offsets(topic, p0=30, p1=10)
        assert reader.latestOffset(everything, ReadAllAvailable()) == everything
        rows = _rows(reader.read(KafkaInputPartition(OffsetRange(topic, 1, 0, 10))))
        assert [r["value"] for r in rows] == [b"v%d" % i for i in range(100, 110)]
        assert {(r["topic"], r["partition"], r["timestampType"], r["heartbeat"]) for r in rows} == {
            (topic, 1, 0, False)
        }
        assert [r["timestamp"].timestamp() * 1000 for r in rows] == [
            pytest.approx(BASE_MS + i) for i in range(100, 110)
        ]
    finally:
        reader.stop()


def test_min_batch_interval_holds_new_records_unless_they_close_a_window(bootstrap: str) -> None:
    """A paced source admits records once per interval: what arrives sooner waits (the plan
    returns its start, so Spark runs a batch only to apply the watermark the last one moved),
    without starting the idle clock; except a record whose event time closes a window, which is
    admitted at once. Trigger.AvailableNow is never paced."""
    topic = _topic(bootstrap, 1)
    _produce(bootstrap, topic, 0, 10)  # event times BASE_MS + 0..9 ms: window [BASE, BASE+5 s)
    reader = _reader(
        bootstrap,
        topic,
        startingOffsets="earliest",
        minBatchIntervalMs="3000",
        windowMs="5000",
        idleTimeoutMs="1",
        heartbeatIntervalMs="0",
    )
    try:
        start = reader.initialOffset()
        first = reader.latestOffset(start, ReadAllAvailable())
        admitted_at = time.monotonic()
        assert first == _offsets(topic, p0=10)  # the first plan is never held
        _produce(bootstrap, topic, 0, 5, first=10)
        # Held, again and again within the interval, and not mistaken for idleness: no heartbeat.
        for _ in range(3):
            assert reader.latestOffset(first, ReadAllAvailable()) == first
            time.sleep(0.1)
        report = reader.reportLatestOffset()
        assert report is not None and report["totalLag"] == 5
        # BASE + 5 s closes the first window (watermark delay 0): admitted at once, with the
        # records held before it.
        _produce(bootstrap, topic, 0, 1, first=5_000)
        closing = reader.latestOffset(first, ReadAllAvailable())
        assert closing == _offsets(topic, p0=16)
        # BASE + 5.001 s closes nothing more: held again.
        _produce(bootstrap, topic, 0, 1, first=5_001)
        assert reader.latestOffset(closing, ReadAllAvailable()) == closing
        assert time.monotonic() - admitted_at < 2.5, "the machine was too slow for this test"
        time.sleep(3.0)  # the interval, counted from the last admission (the closing one)
        later = reader.latestOffset(closing, ReadAllAvailable())
        assert later == _offsets(topic, p0=17)
        # AvailableNow reads everything at once, however soon after the last admission.
        _produce(bootstrap, topic, 0, 10, first=20)
        reader.prepareForTriggerAvailableNow()
        assert reader.latestOffset(later, ReadAllAvailable())["offsets"] == {topic: {"0": 27}}
    finally:
        reader.stop()


def test_a_look_at_the_tails_does_not_hold_the_next_plan(bootstrap: str) -> None:
    """Spark starts a query with initialOffset, latestOffset (which looks at the partitions'
    last records to pace admission) and initialOffset again (the first batch's start). A broker
    answers one connection's requests in order, and the look's consumer leaves a fetch open at the
    log's end for fetch.wait.max.ms: a metadata request sent on that connection waited behind it
    (measured: 0.44-0.48 s with the default 500 ms, on every `ipcount run` over a backlog). With a
    10 s hold the old code took ~10 s here."""
    topic = _topic(bootstrap, 2)
    _produce(bootstrap, topic, 0, 20)
    _produce(bootstrap, topic, 1, 20, first=100)
    reader = _reader(
        bootstrap,
        topic,
        startingOffsets="earliest",
        minBatchIntervalMs="3000",
        windowMs="5000",
        **{"kafka.fetch.wait.max.ms": "10000"},
    )
    try:
        start = reader.initialOffset()
        reader.latestOffset(start, ReadAllAvailable())  # the first plan looks at the tails
        began = time.monotonic()
        assert reader.initialOffset() == start
        assert time.monotonic() - began < 5.0, "the plan waited behind the look's open fetch"
    finally:
        reader.stop()


def test_each_look_at_the_tails_finds_the_newest_record_without_waiting_on_the_last(
    bootstrap: str,
) -> None:
    """A paced live query looks at the partitions' last records at every plan, so that a record
    closing a window is admitted at once; an AvailableNow run's last data batch looks again for
    its flush heartbeat's base. Each look reads records that are there, then leaves its consumer
    fetching at the log's end, where the broker holds the fetch for fetch.wait.max.ms (500 ms by
    default), and the next look's fetch queued behind it on the same connection: every look but
    the first took ~0.5 s and often gave up at the pacing look's 0.5 s deadline, without the
    record that closes the window. Here the user's consumers wait 10 s at the log's end, which
    the driver's looks must not inherit."""
    topic = _topic(bootstrap, 2)
    _produce(bootstrap, topic, 0, 10)  # event times BASE_MS + 0..9 ms: window [BASE, BASE+5 s)
    _produce(bootstrap, topic, 1, 10, first=100)
    reader = _reader(
        bootstrap,
        topic,
        startingOffsets="earliest",
        minBatchIntervalMs="600000",  # only a window-closing record is admitted before it
        windowMs="5000",
        idleTimeoutMs="600000",  # heartbeats on: the AvailableNow flush below
        **{"kafka.fetch.wait.max.ms": "10000"},
    )
    try:
        plan = reader.latestOffset(reader.initialOffset(), ReadAllAvailable())
        assert plan == _offsets(topic, p0=10, p1=10)  # the first plan is never held
        # Records that close nothing wait for the interval; Spark plans again at every tick, and
        # every plan looks at the same tails.
        _produce(bootstrap, topic, 0, 5, first=10)
        began = time.monotonic()
        for _ in range(8):
            assert reader.latestOffset(plan, ReadAllAvailable()) == plan
        took = time.monotonic() - began
        assert took < 2.0, f"8 held plans took {took:.1f} s: each waited on the last look's fetch"
        for k in range(1, 3):
            # BASE + 5k s closes window k - 1 (watermark delay 0): admitted by the next plan.
            _produce(bootstrap, topic, k % 2, 1, first=5_000 * k)
            closing = reader.latestOffset(plan, ReadAllAvailable())
            assert closing != plan, f"plan {k}: the record closing window {k - 1} was held"
            plan = closing
        # AvailableNow: the run's last data batch carries a flush heartbeat from the newest record.
        _produce(bootstrap, topic, 0, 1, first=20_000)
        reader.prepareForTriggerAvailableNow()
        began = time.monotonic()
        last = reader.latestOffset(plan, ReadAllAvailable())
        took = time.monotonic() - began
        assert last["heartbeat"]["base"] == BASE_MS + 20_000, last
        assert took < 2.0, f"the flush's look took {took:.1f} s"
    finally:
        reader.stop()


def test_starting_offsets_json_and_missing_topic(bootstrap: str) -> None:
    topic = _topic(bootstrap, 2)
    _produce(bootstrap, topic, 0, 5)
    _produce(bootstrap, topic, 1, 7)
    reader = _reader(bootstrap, topic, startingOffsets=json.dumps({topic: {"0": 3, "1": -1}}))
    try:
        assert reader.initialOffset() == _offsets(topic, p0=3, p1=7)
    finally:
        reader.stop()
    partial = _reader(bootstrap, topic, startingOffsets=json.dumps({topic: {"0": -2}}))
    with pytest.raises(SourceError, match=f"missing: {topic}/1"):
        partial.initialOffset()
    partial.stop()

    missing = f"nosuch-{uuid.uuid4().hex[:8]}"
    reader = _reader(bootstrap, missing)
    with pytest.raises(SourceError, match=f"topic '{missing}' .* does not exist"):
        reader.initialOffset()
    reader.stop()
    # The broker auto-creates topics on metadata requests that allow it; the source must not.
    admin = AdminClient(with_client_logging({"bootstrap.servers": bootstrap}))
    assert missing not in admin.list_topics(timeout=10).topics


def test_data_loss_on_the_driver(bootstrap: str) -> None:
    topic = _topic(bootstrap, 1)
    _produce(bootstrap, topic, 0, 100)
    admin = AdminClient(with_client_logging({"bootstrap.servers": bootstrap}))
    for fut in admin.delete_records([TopicPartition(topic, 0, 40)]).values():
        fut.result(timeout=30)

    strict = _reader(bootstrap, topic)
    with pytest.raises(
        SourceError, match=f"data loss: partition {topic}/0: offsets 10-39 were deleted"
    ):
        strict.latestOffset(_offsets(topic, p0=10), ReadAllAvailable())
    with pytest.raises(
        SourceError, match=f"{topic}/0: offset 500 is beyond the end of the log \\(100\\)"
    ):
        strict.latestOffset(_offsets(topic, p0=500), ReadAllAvailable())
    vanished = {"offsets": {topic: {"0": 50, "3": 9}}}
    with pytest.raises(SourceError, match=f"partition {topic}/3 no longer exists"):
        strict.latestOffset(vanished, ReadAllAvailable())
    strict.stop()

    lenient = _reader(bootstrap, topic, failOnDataLoss="false", maxOffsetsPerTrigger="20")
    try:
        # Lost offsets 10-39 are skipped: the limit counts from the log start (40).
        end = lenient.latestOffset(_offsets(topic, p0=10), ReadMaxRows(20))
        assert end == _offsets(topic, p0=60)
        # Beyond the end: the partition moves back to the log end and its range is skipped.
        back = lenient.latestOffset(_offsets(topic, p0=500), ReadAllAvailable())
        assert back == _offsets(topic, p0=100)
        assert lenient.partitions(_offsets(topic, p0=500), back) == []
        assert lenient.latestOffset(vanished, ReadAllAvailable()) == _offsets(topic, p0=100)
    finally:
        lenient.stop()


def test_data_loss_while_reading_on_an_executor(bootstrap: str) -> None:
    topic = _topic(bootstrap, 1)
    _produce(bootstrap, topic, 0, 100)
    admin = AdminClient(with_client_logging({"bootstrap.servers": bootstrap}))
    for fut in admin.delete_records([TopicPartition(topic, 0, 40)]).values():
        fut.result(timeout=30)
    # As if the records were deleted after the driver planned [10, 100).
    task = KafkaInputPartition(OffsetRange(topic, 0, 10, 100))
    with pytest.raises(
        DataLossError,
        match=f"data loss: partition {topic}/0: offsets 10-39 were deleted before they were read "
        r"\(log now starts at 40\) \(read task 10-100; 30 offsets\).*fail_on_data_loss = false",
    ):
        _rows(_reader(bootstrap, topic).read(task))
    rows = _rows(_reader(bootstrap, topic, failOnDataLoss="false").read(task))
    assert [r["offset"] for r in rows] == list(range(40, 100))


def test_a_read_task_whose_whole_range_was_deleted_ends_at_once(bootstrap: str) -> None:
    """failOnDataLoss=false: the rest of a task's range deleted is skipped, not waited for until
    kafkaConsumer.pollTimeoutMs (and then failed, again and again); the skipped offsets are
    handed to the task's tally."""
    from ipcount.source.options import parse_options
    from ipcount.source.partition_reader import read_messages

    topic = _topic(bootstrap, 1)
    _produce(bootstrap, topic, 0, 100)
    admin = AdminClient(with_client_logging({"bootstrap.servers": bootstrap}))
    for fut in admin.delete_records([TopicPartition(topic, 0, 40)]).values():
        fut.result(timeout=30)
    lenient = {"failOnDataLoss": "false", "kafkaConsumer.pollTimeoutMs": "8000"}
    started = time.monotonic()
    gone = KafkaInputPartition(OffsetRange(topic, 0, 10, 30))
    assert _rows(_reader(bootstrap, topic, **lenient).read(gone)) == []
    assert time.monotonic() - started < 6
    opts = parse_options({"kafka.bootstrap.servers": bootstrap, "subscribe": topic, **lenient})
    lost: list[int] = []
    for rng in (OffsetRange(topic, 0, 10, 30), OffsetRange(topic, 0, 20, 60)):
        read = [
            m.offset() for chunk in read_messages(opts, rng, on_lost=lost.append) for m in chunk
        ]
        assert read == list(range(max(40, rng.start), rng.end))
    assert lost == [20, 20]


def test_open_transaction_is_not_data_loss_and_reads_stop_at_the_stable_offset(
    bootstrap: str,
) -> None:
    topic = _topic(bootstrap, 1)
    _produce(bootstrap, topic, 0, 3)
    producer = Producer(
        with_client_logging(
            {"bootstrap.servers": bootstrap, "transactional.id": f"tx-{uuid.uuid4().hex}"}
        )
    )
    producer.init_transactions(30)
    producer.begin_transaction()
    producer.produce(topic, value=b"open", partition=0)
    producer.flush(30)
    try:
        committed = _reader(bootstrap, topic)
        uncommitted = _reader(bootstrap, topic, **{"kafka.isolation.level": "read_uncommitted"})
        # read_committed stops at the last stable offset (3), read_uncommitted at the end (4).
        assert committed.latestOffset(_offsets(topic, p0=0), ReadAllAvailable()) == _offsets(
            topic, p0=3
        )
        assert uncommitted.latestOffset(_offsets(topic, p0=0), ReadAllAvailable()) == _offsets(
            topic, p0=4
        )
        # A position past the LSO (e.g. planned read_uncommitted before) waits instead of failing.
        assert committed.latestOffset(_offsets(topic, p0=4), ReadAllAvailable()) == _offsets(
            topic, p0=4
        )
        committed.stop()
        uncommitted.stop()
        # Idle there with heartbeats on: the last event time is read below the stable offset
        # (record 2), without waiting for the open transaction.
        idle = _reader(bootstrap, topic, idleTimeoutMs="1", heartbeatIntervalMs="0")
        try:
            start = _offsets(topic, p0=4)
            assert idle.latestOffset(start, ReadAllAvailable()) == start  # idle clock starts
            time.sleep(0.05)
            beat = idle.latestOffset(start, ReadAllAvailable())
            assert beat["offsets"] == start["offsets"]
            assert beat["heartbeat"]["seq"] == 1 and beat["heartbeat"]["base"] == BASE_MS + 2
            assert beat["heartbeat"]["ts"] >= BASE_MS + 2 + 50
            (task,) = idle.partitions(start, beat)
            assert task.range is None
            (row,) = _rows(idle.read(task))
            assert row["heartbeat"]
            assert row["timestamp"].timestamp() * 1000 == pytest.approx(beat["heartbeat"]["ts"])
            # Replanning the same batch (a replay) gives the same heartbeat task.
            assert idle.partitions(start, beat)[0].heartbeat_ms == task.heartbeat_ms
        finally:
            idle.stop()
    finally:
        producer.abort_transaction(30)


def test_unsubscribed_topic_in_checkpoint_is_dropped(bootstrap: str) -> None:
    topic = _topic(bootstrap, 1)
    _produce(bootstrap, topic, 0, 4)
    reader = _reader(bootstrap, topic)
    try:
        start = {"offsets": {"old-topic": {"0": 7}, topic: {"0": 1}}}
        assert reader.latestOffset(start, ReadAllAvailable()) == _offsets(topic, p0=4)
    finally:
        reader.stop()


def test_heartbeat_base_is_the_newest_event_even_out_of_order(bootstrap: str) -> None:
    from ipcount.source.offset_reader import KafkaOffsetReader
    from ipcount.source.options import parse_options

    topic = _topic(bootstrap, 2)
    producer = Producer(with_client_logging({"bootstrap.servers": bootstrap}))
    # The newest event (9 s) is neither the first nor the last record of partition 0.
    for ts in (1_000, 9_000, 3_000, 2_000):
        producer.produce(topic, value=b"x", partition=0, timestamp=BASE_MS + ts)
    producer.produce(topic, value=b"y", partition=1, timestamp=BASE_MS + 4_000)
    assert producer.flush(30) == 0
    offsets = KafkaOffsetReader(
        parse_options({"kafka.bootstrap.servers": bootstrap, "subscribe": topic})
    )
    try:
        # Everything read: the broker's MAX_TIMESTAMP lookup gives the exact newest event.
        assert offsets.latest_event_ms({(topic, 0): 4, (topic, 1): 1}) == BASE_MS + 9_000
        # Only the first record of partition 0 read: the newest record lies beyond the range, so
        # the tail scan of what was read decides (partition 1's 4 s is the newest of that).
        assert offsets.latest_event_ms({(topic, 0): 1, (topic, 1): 1}) == BASE_MS + 4_000
        assert offsets.latest_event_ms({(topic, 0): 1, (topic, 1): 0}) == BASE_MS + 1_000
    finally:
        offsets.close()


def test_heartbeat_base_is_a_counted_event_time_not_a_bogus_timestamp(bootstrap: str) -> None:
    """The idle heartbeat starts from the newest event time the job would count: a malformed
    record, a line stamped far in the future, or a producer's future Kafka timestamp cannot
    drag the watermark ahead (they would make every later on-time record late, for ever)."""
    from ipcount.formats.accesslog import format_record
    from ipcount.source.offset_reader import KafkaOffsetReader
    from ipcount.source.options import parse_options

    topic = _topic(bootstrap, 1)
    now = int(time.time() * 1000)
    on_time = now - 60_000
    producer = Producer(with_client_logging({"bootstrap.servers": bootstrap}))
    producer.produce(topic, value=format_record("10.0.0.1", on_time).encode(), timestamp=on_time)
    # Valid line, on time, but its producer's clock is 40 minutes ahead.
    producer.produce(
        topic, value=format_record("10.0.0.2", on_time).encode(), timestamp=now + 2_400_000
    )
    producer.produce(topic, value=b"not an access record", timestamp=now + 3_000_000)
    future = 4_070_908_800_000  # 2099-01-01
    producer.produce(topic, value=format_record("10.0.0.3", future).encode(), timestamp=now)
    assert producer.flush(30) == 0
    offsets = KafkaOffsetReader(
        parse_options(
            {
                "kafka.bootstrap.servers": bootstrap,
                "subscribe": topic,
                "eventTimeFormat": "nginx-combined",
                "maxFutureSkewMs": "300000",
            }
        )
    )
    try:
        assert offsets.latest_event_ms({(topic, 0): 4}, now_ms=now) == on_time // 1000 * 1000
    finally:
        offsets.close()


def test_large_records_are_handed_over_in_byte_bounded_batches(bootstrap: str) -> None:
    """900 KB records: a read task's Arrow batches stay within maxBytesPerBatch (plus the record
    that crosses it), instead of 50,000 records (45 GB) at a time."""
    topic = _topic(bootstrap, 1)
    producer = Producer(with_client_logging({"bootstrap.servers": bootstrap, "linger.ms": 5}))
    record = 900_000
    for i in range(24):
        producer.produce(topic, value=bytes([65 + i % 26]) * record, partition=0)
    assert producer.flush(60) == 0
    limit = 4 * 1024 * 1024
    reader = _reader(bootstrap, topic, maxBytesPerBatch=str(limit))
    batches = list(reader.read(KafkaInputPartition(OffsetRange(topic, 0, 0, 24))))
    sizes = [sum(len(v) for v in b.column("value").to_pylist()) for b in batches]
    assert sum(b.num_rows for b in batches) == 24
    assert len(batches) >= 5 and max(sizes) <= limit + record, sizes
