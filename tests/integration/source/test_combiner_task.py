"""The combiner's read tasks against the broker: what one task hands Spark for an offset range
(output=counts), and the records it leaves out (output=rejects), through the real Kafka read."""

from __future__ import annotations

from collections.abc import Callable

import pyarrow as pa

from ipcount.formats.accesslog import format_record
from ipcount.source.offsets import OffsetRange
from ipcount.source.options import parse_options
from ipcount.source.reader import KafkaInputPartition, KafkaStreamReader

T0 = 1_767_225_600_000  # a window boundary
SKEW = 300_000


def _read(bootstrap: str, topic: str, output: str, n: int) -> pa.Table:
    reader = KafkaStreamReader(
        parse_options(
            {
                "subscribe": topic,
                "kafka.bootstrap.servers": bootstrap,
                "eventTimeFormat": "nginx-combined",
                "output": output,
                "maxFutureSkewMs": str(SKEW),
                "queryCheckpoint": "/unused/here",
            }
        )
    )
    # Batch time T0 + 60 s; the previous batch's watermark T0 + 10 s (windows ending by it: late).
    task = KafkaInputPartition(OffsetRange(topic, 0, 0, n), None, T0 + 10_000, T0 + 60_000)
    batches = list(reader.read(task))
    return pa.Table.from_batches(batches) if batches else pa.table({})


def test_a_task_reads_its_range_and_hands_spark_partial_counts_and_rejects(
    bootstrap: str, topic_with: Callable[[list[bytes]], str]
) -> None:
    good = [format_record(f"10.0.0.{i % 3}", T0 + (i % 20) * 1_000).encode() for i in range(600)]
    bad = [b"junk", format_record("10.0.0.9", T0 + 60_000 + SKEW + 1_000).encode()]
    values = good[:300] + bad[:1] + good[300:] + bad[1:]
    topic = topic_with(values)

    counts = _read(bootstrap, topic, "counts", len(values))
    assert counts.equals(_read(bootstrap, topic, "counts", len(values)))  # a replay: same rows
    rows = counts.to_pylist()
    counted = [r for r in rows if r["kind"] == "counted"]
    assert len(counted) == 4 * 3  # 20 s of event time: 4 windows, 3 clients
    assert sum(r["count"] for r in counted) == 600
    assert {r["late"] for r in counted if r["window_start"].timestamp() * 1000 < T0 + 10_000} == {
        True
    }
    assert sum(r["count"] for r in counted if r["late"]) == 300  # the windows before T0 + 10 s
    tallies = {r["kind"]: r["count"] for r in rows if r["kind"] != "counted"}
    assert tallies == {"malformed": 1, "future": 1}

    rejects = _read(bootstrap, topic, "rejects", len(values)).to_pylist()
    assert [(r["offset"], r["value"], r["reason"]) for r in rejects] == [
        (300, b"junk", "malformed: not a valid nginx combined-format line"),
        (601, bad[1], "future: event time more than 300 s ahead of its batch time"),
    ]
