"""The Kafka source in real Spark streaming queries against the broker: exactness, restarts, limits,
transactions, new partitions, data loss and heartbeats."""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewPartitions, NewTopic
from pyspark.errors import StreamingQueryException
from pyspark.sql import functions as F

from ipcount.kafka.client import with_client_logging

BASE_MS = 1_700_000_000_000
# key, value, topic, partition, offset, timestamp, timestampType, heartbeat
Row = tuple[Any, ...]


def _admin(bootstrap: str) -> AdminClient:
    return AdminClient(with_client_logging({"bootstrap.servers": bootstrap}))


def _topic(bootstrap: str, partitions: int) -> str:
    name = f"src-{uuid.uuid4().hex[:10]}"
    new = NewTopic(
        name, num_partitions=partitions, replication_factor=1, config={"retention.ms": "-1"}
    )
    admin = _admin(bootstrap)  # keep the client alive until its futures are done
    for fut in admin.create_topics([new]).values():
        fut.result(timeout=30)
    return name


def _produce(bootstrap: str, topic: str, records: list[tuple[int, bytes, int]]) -> None:
    """Produce (partition, value, timestamp ms) records; the key is the value."""
    producer = Producer(with_client_logging({"bootstrap.servers": bootstrap, "linger.ms": 5}))
    for partition, value, ts in records:
        producer.produce(topic, key=value, value=value, partition=partition, timestamp=ts)
    assert producer.flush(30) == 0


class Collector:
    """A foreachBatch sink that keeps every batch's rows and input partition count on the driver."""

    def __init__(self) -> None:
        self.batches: dict[int, list[Row]] = {}
        self.tasks: dict[int, int] = {}
        self.calls = 0

    def __call__(self, df: Any, batch_id: int) -> None:
        self.tasks[batch_id] = df.rdd.getNumPartitions()
        self.batches[batch_id] = [tuple(r) for r in df.collect()]
        self.calls += 1

    def rows(self) -> list[Row]:
        return [r for b in sorted(self.batches) for r in self.batches[b]]


def _stream(spark: Any, options: dict[str, str]) -> Any:
    reader = spark.readStream.format("ipcount-kafka")
    for key, value in options.items():
        reader = reader.option(key, value)
    return reader.load()


def _run_available_now(
    df: Any, checkpoint: Path, sink: Collector, timeout: float = 120
) -> list[Any]:
    query = (
        df.writeStream.foreachBatch(sink)
        .option("checkpointLocation", str(checkpoint))
        .trigger(availableNow=True)
        .start()
    )
    try:
        assert query.awaitTermination(timeout), "Trigger.AvailableNow query did not finish"
    finally:
        query.stop()
    assert query.exception() is None
    return [p for p in query.recentProgress if p.numInputRows or p.sources[0].endOffset]


def _wait(condition: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.2)


def test_exact_records_across_limited_batches_restart_and_new_partition(
    spark: Any, bootstrap: str, tmp_path: Path
) -> None:
    topic = _topic(bootstrap, 3)
    sizes = ((0, 500), (1, 300), (2, 100))
    first = [(p, f"a{p}-{i}".encode(), BASE_MS + i) for p, n in sizes for i in range(n)]
    _produce(bootstrap, topic, first)
    options = {
        "kafka.bootstrap.servers": bootstrap,
        "subscribe": topic,
        "startingOffsets": "earliest",
        "maxOffsetsPerTrigger": "250",
        "minPartitions": "6",
    }
    checkpoint = tmp_path / "ckpt"
    sink = Collector()
    progress = _run_available_now(_stream(spark, options), checkpoint, sink)

    assert [p.numInputRows for p in progress] == [250, 250, 250, 150]
    assert sorted(sink.batches) == [0, 1, 2, 3]
    assert sink.tasks[0] >= 6, "minPartitions=6 must split the 3 partitions' ranges"
    latest = json.loads(progress[0].sources[0].latestOffset)
    assert latest["totalLag"] == 650 and latest["offsets"] == {
        topic: {"0": 500, "1": 300, "2": 100}
    }

    # Stop, produce more, add a partition; the restarted query resumes exactly where it stopped.
    second = [(p, f"b{p}-{i}".encode(), BASE_MS + 1_000 + i) for p in range(3) for i in range(100)]
    _produce(bootstrap, topic, second)
    admin = _admin(bootstrap)
    for fut in admin.create_partitions([NewPartitions(topic, 4)]).values():
        fut.result(timeout=30)
    _wait(
        lambda: len(_admin(bootstrap).list_topics(topic, timeout=10).topics[topic].partitions) == 4,
        30,
        "the 4th partition",
    )
    third = [(3, f"c3-{i}".encode(), BASE_MS + 2_000 + i) for i in range(50)]
    _produce(bootstrap, topic, third)
    progress = _run_available_now(_stream(spark, options), checkpoint, sink)
    assert [p.numInputRows for p in progress] == [250, 100]
    assert sorted(sink.batches) == [0, 1, 2, 3, 4, 5]

    expected: dict[tuple[int, int], tuple[bytes, int]] = {}
    for records in (first, second, third):
        for p in sorted({r[0] for r in records}):
            base = sum(1 for tp in expected if tp[0] == p)
            for i, (_, value, ts) in enumerate(r for r in records if r[0] == p):
                expected[(p, base + i)] = (value, ts)
    rows = sink.rows()
    got = [(r[3], r[4]) for r in rows]
    assert len(got) == len(set(got)) == len(expected) == 1_250, "no duplicates, no gaps"
    for key, value, t, partition, offset, ts, ts_type, heartbeat, _late_before in rows:
        assert (key, value) == (expected[(partition, offset)][0],) * 2
        assert int(ts.timestamp() * 1000) == expected[(partition, offset)][1]
        assert (t, ts_type, heartbeat) == (topic, 0, False)


def test_transactions_read_committed_and_uncommitted(
    spark: Any, bootstrap: str, tmp_path: Path
) -> None:
    topic = _topic(bootstrap, 1)
    producer = Producer(
        with_client_logging(
            {"bootstrap.servers": bootstrap, "transactional.id": f"tx-{uuid.uuid4().hex}"}
        )
    )
    producer.init_transactions(30)
    # Offsets: committed 0-9 + marker 10, aborted 11-17 + marker 18, committed 19-23 + marker 24.
    for prefix, count, commit in (("c1", 10, True), ("ab", 7, False), ("c2", 5, True)):
        producer.begin_transaction()
        for i in range(count):
            producer.produce(
                topic, value=f"{prefix}-{i}".encode(), partition=0, timestamp=BASE_MS + i
            )
        producer.flush(30)
        (producer.commit_transaction if commit else producer.abort_transaction)(30)
    committed = [f"c1-{i}" for i in range(10)] + [f"c2-{i}" for i in range(5)]
    aborted = [f"ab-{i}" for i in range(7)]

    # One query, two sources: read_committed (default) and read_uncommitted. A limit of 8
    # offsets puts batch ends inside the aborted run and makes the last range a lone marker.
    common = {
        "kafka.bootstrap.servers": bootstrap,
        "subscribe": topic,
        "startingOffsets": "earliest",
        "maxOffsetsPerTrigger": "8",
    }
    rc = _stream(spark, common).withColumn("src", F.lit("rc"))
    ru = _stream(spark, {**common, "kafka.isolation.level": "read_uncommitted"}).withColumn(
        "src", F.lit("ru")
    )
    sink = Collector()
    _run_available_now(rc.unionByName(ru), tmp_path / "ckpt", sink)

    rows = sink.rows()
    seen = {src: [r[1].decode() for r in rows if r[-1] == src] for src in ("rc", "ru")}
    assert sorted(seen["rc"]) == sorted(committed)
    assert sorted(seen["ru"]) == sorted(committed + aborted)
    assert len(sink.batches) >= 3


def test_data_loss_fails_the_query_or_skips_when_allowed(
    spark: Any, bootstrap: str, tmp_path: Path
) -> None:
    topic = _topic(bootstrap, 1)
    _produce(bootstrap, topic, [(0, b"v%d" % i, BASE_MS + i) for i in range(100)])
    admin = _admin(bootstrap)
    for fut in admin.delete_records([TopicPartition(topic, 0, 40)]).values():
        fut.result(timeout=30)
    options = {
        "kafka.bootstrap.servers": bootstrap,
        "subscribe": topic,
        "startingOffsets": json.dumps({topic: {"0": 10}}),
    }
    query = (
        _stream(spark, options)
        .writeStream.foreachBatch(Collector())
        .option("checkpointLocation", str(tmp_path / "strict"))
        .trigger(availableNow=True)
        .start()
    )
    try:
        with pytest.raises(StreamingQueryException) as failure:
            query.awaitTermination(120)
    finally:
        query.stop()
    message = str(failure.value)
    assert "DataLossError" in message and f"{topic}/0: offsets 10-39 were deleted" in message
    assert "fail_on_data_loss = false" in message

    sink = Collector()
    _run_available_now(
        _stream(spark, {**options, "failOnDataLoss": "false"}), tmp_path / "lenient", sink
    )
    assert [r[4] for r in sink.rows()] == list(range(40, 100))


def test_heartbeats_flush_replay_idle_advance_and_stop(
    spark: Any, bootstrap: str, tmp_path: Path
) -> None:
    topic = _topic(bootstrap, 2)
    last_event = BASE_MS + 9_000
    # The latest event time is on partition 1; partition 0's last record is older.
    _produce(
        bootstrap,
        topic,
        [(0, b"p0-%d" % i, BASE_MS + i * 100) for i in range(5)]
        + [(1, b"p1-%d" % i, BASE_MS + i * 1_000) for i in range(10)],
    )
    options = {
        "kafka.bootstrap.servers": bootstrap,
        "subscribe": topic,
        "startingOffsets": "earliest",
        "idleTimeoutMs": "1000",
        "heartbeatIntervalMs": "1000",
        "heartbeatMaxAdvanceMs": "4000",
    }

    # Trigger.AvailableNow, by default: the run ends at its newest event time. The data batch
    # carries a flush heartbeat at the last event, and one more batch (1 ms later) lets Spark
    # apply the watermark the data moved: the windows the data closed are emitted, nothing more.
    data_mode = Collector()
    _run_available_now(_stream(spark, options), tmp_path / "data-mode", data_mode)
    assert sorted(data_mode.batches) == [0, 1]
    assert [int(r[5].timestamp() * 1000) for r in data_mode.rows() if r[7]] == [
        last_event,
        last_event + 1,
    ]

    # availableNowFlush=all (`ipcount run --close-all-windows`): once the data batches are done,
    # a heartbeat at the end of the newest event's window plus the watermark delay closes exactly
    # the windows that hold data (no wall clock), and one more (1 ms later) lets Spark run a batch
    # with the watermark it moved.
    options = {
        **options,
        "availableNowFlush": "all",
        "windowMs": "5000",
        "watermarkDelayMs": "2000",
    }
    closing = BASE_MS + 10_000 + 2_000  # the window [BASE_MS + 5 s, + 10 s) holds last_event
    checkpoint = tmp_path / "once"
    sink = Collector()
    _run_available_now(_stream(spark, options), checkpoint, sink)
    assert sorted(sink.batches) == [0, 1, 2]
    assert len(sink.batches[0]) == 15 and not any(r[7] for r in sink.batches[0])
    (flush,) = sink.batches[1]
    assert flush[0] is None and flush[1] is None and (flush[3], flush[4]) == (-1, -1)
    assert flush[7] is True and int(flush[5].timestamp() * 1000) == closing
    (second,) = sink.batches[2]
    assert second[7] is True and int(second[5].timestamp() * 1000) == closing + 1

    # Replay: forget the heartbeat batches and that any batch was committed; the restarted query
    # re-runs batch 0 with identical rows, plans the same two heartbeats (they live in the
    # offsets), and then ends without another.
    for name in ("1", ".1.crc", "2", ".2.crc"):
        (checkpoint / "offsets" / name).unlink(missing_ok=True)
    for name in ("0", ".0.crc", "1", ".1.crc", "2", ".2.crc"):
        (checkpoint / "commits" / name).unlink(missing_ok=True)
    replay = Collector()
    _run_available_now(_stream(spark, options), checkpoint, replay)
    assert {b: sorted(rows, key=repr) for b, rows in replay.batches.items()} == {
        b: sorted(rows, key=repr) for b, rows in sink.batches.items()
    }

    # Continuous triggers: after 1 s idle, heartbeats advance with idle time up to the cap, then stop.
    live = Collector()
    query = (
        _stream(spark, options)
        .writeStream.foreachBatch(live)
        .option("checkpointLocation", str(tmp_path / "live"))
        .trigger(processingTime="200 milliseconds")
        .start()
    )
    try:

        def heartbeats() -> list[int]:
            return [int(r[5].timestamp() * 1000) for r in live.rows() if r[7]]

        _wait(lambda: last_event + 4_000 in heartbeats(), 60, "heartbeats up to the cap")
        calls = live.calls
        time.sleep(2.5)
        assert live.calls == calls, "no batches once heartbeats reached the cap"
        beats = heartbeats()
        assert beats == sorted(set(beats)) and beats[-1] == last_event + 4_000
        assert beats[0] >= last_event + 1_000
        assert all(b - a >= 1_000 for a, b in zip(beats, beats[1:-1], strict=False))
        assert len(beats) >= 2
        for batch_id, rows in live.batches.items():
            if any(r[7] for r in rows):
                assert len(rows) == 1, f"heartbeat batch {batch_id} must hold exactly one row"

        # A new record stops the heartbeats; idleness then starts again from its event time.
        newer = last_event + 60_000
        _produce(bootstrap, topic, [(0, b"late-arrival", newer)])
        _wait(lambda: any(r[1] == b"late-arrival" for r in live.rows()), 30, "the new record")
        _wait(lambda: any(ts > newer for ts in heartbeats()), 30, "heartbeats after the new record")
        assert query.exception() is None
    finally:
        query.stop()
