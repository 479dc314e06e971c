"""A live batch's few records over several partitions, through the real read path: planned as
one read task (a task costs a Python worker's hand-over and a Kafka consumer, more than its few
records), which counts exactly what one task per partition counts and leaves each range its own
clean-range marker."""

from __future__ import annotations

import uuid
from collections import Counter
from pathlib import Path

import pyarrow as pa
from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, NewTopic

from ipcount.formats.accesslog import format_record
from ipcount.kafka.client import with_client_logging
from ipcount.source.offsets import OffsetRange
from ipcount.source.options import parse_options
from ipcount.source.reader import KafkaInputPartition, KafkaStreamReader

T0 = 1_767_225_600_000  # a window boundary
SKEW = 300_000
PER_PARTITION = 200


def _topic(bootstrap: str) -> str:
    """Three partitions of access lines; partition 1 also holds one line that is not one."""
    name = f"small-{uuid.uuid4().hex[:10]}"
    admin = AdminClient(with_client_logging({"bootstrap.servers": bootstrap}))
    for fut in admin.create_topics([NewTopic(name, 3, 1)]).values():
        fut.result(timeout=30)
    producer = Producer(with_client_logging({"bootstrap.servers": bootstrap, "linger.ms": 5}))
    for p in range(3):
        for i in range(PER_PARTITION):
            line = format_record(f"10.0.{p}.{i % 7}", T0 + (i % 10) * 1_000)
            producer.produce(name, value=line.encode(), partition=p)
        if p == 1:
            producer.produce(name, value=b"not an access line", partition=p)
    assert producer.flush(30) == 0
    return name


def _counts(batches: list[pa.RecordBatch]) -> Counter[tuple[object, ...]]:
    out: Counter[tuple[object, ...]] = Counter()
    for row in pa.Table.from_batches(batches).to_pylist():
        out[row["kind"], row.get("window_start"), row.get("ip")] += row["count"]
    return out


def test_a_small_batch_is_one_read_task_that_counts_as_one_per_partition(
    bootstrap: str, tmp_path: Path
) -> None:
    topic = _topic(bootstrap)
    ends = {0: PER_PARTITION, 1: PER_PARTITION + 1, 2: PER_PARTITION}
    start = {"offsets": {topic: {str(p): 0 for p in ends}}}
    end = {"offsets": {topic: {str(p): e for p, e in ends.items()}}}

    # Planned as the job plans a live batch (job.min_partitions = 0: at least twice the cores,
    # no range split below 50,000 records).
    planner = KafkaStreamReader(
        parse_options(
            {
                "kafka.bootstrap.servers": bootstrap,
                "subscribe": topic,
                "eventTimeFormat": "nginx-combined",
                "output": "counts",
                "minPartitions": "4",
                "minSplitRecords": "50000",
            }
        )
    )
    (task,) = planner.partitions(start, end)
    ranges = [OffsetRange(topic, p, 0, e) for p, e in ends.items()]
    assert isinstance(task, KafkaInputPartition) and list(task.ranges) == ranges

    # Read with the batch's marks, as the job's tasks are: one task over the three ranges
    # counts what three tasks count, and marks each clean range (not partition 1's).
    reader = KafkaStreamReader(
        parse_options(
            {
                "kafka.bootstrap.servers": bootstrap,
                "subscribe": topic,
                "eventTimeFormat": "nginx-combined",
                "output": "counts",
                "maxFutureSkewMs": str(SKEW),
                "queryCheckpoint": str(tmp_path / "counts"),
                "cleanRangeMarkers": "true",
            }
        )
    )
    marks = (T0, T0 + 60_000)
    one = _counts(
        list(reader.read(KafkaInputPartition(ranges[0], None, *marks, more=tuple(ranges[1:]))))
    )
    markers = sorted(p.name for p in (tmp_path / "counts" / "clean-ranges").rglob("*-*-*"))
    each = sum(
        (_counts(list(reader.read(KafkaInputPartition(r, None, *marks)))) for r in ranges),
        Counter(),
    )
    assert one == each
    assert sum(n for (kind, _, _), n in one.items() if kind == "counted") == 3 * PER_PARTITION
    assert one["malformed", None, None] == 1
    assert [name.split("-")[:3] for name in markers] == [["0", "0", "200"], ["2", "0", "200"]]
