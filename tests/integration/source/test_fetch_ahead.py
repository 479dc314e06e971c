"""A read task fetches what its range needs, not the log behind it: a micro-batch's range usually
ends long before the partition does (a backlog read 500k records at a time, a live topic that
keeps growing), and every record fetched past the end costs the broker, librdkafka and the task's
CPU for nothing."""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from typing import Any

import pytest
from confluent_kafka import Consumer

from ipcount.source import partition_reader
from ipcount.source.offsets import OffsetRange
from ipcount.source.options import parse_options
from ipcount.source.partition_reader import chunk_values, read_chunks

LINE = (
    b'203.0.113.7 - - [01/Jan/2026:00:00:00 +0000] "GET /index.html HTTP/1.1" 200 512 "-" '
    b'"Mozilla/5.0 (X11; Linux x86_64) AppleWebKit/537.36 (KHTML, like Gecko) Chrome/120.0"'
)
RANGE = 100_000
BEHIND = 400_000
# A consumer keeps a window of records fetched ahead (queued.min.messages, 20k, and one fetch
# response), so the task never waits on the network; it must not read the partition to its end.
MAX_FETCHED_PAST_END = 40_000


def test_a_read_task_fetches_little_past_its_range(
    bootstrap: str,
    topic_with: Callable[[list[bytes]], str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    topic = topic_with([LINE] * (RANGE + BEHIND))
    stats: list[dict[str, Any]] = []
    made = partition_reader.new_consumer

    def with_stats(conf: Mapping[str, str]) -> Consumer:
        # librdkafka's own count of the messages it received from the broker.
        return made({**conf, "statistics.interval.ms": "5", "stats_cb": _keep(stats)})

    monkeypatch.setattr(partition_reader, "new_consumer", with_stats)
    options = parse_options({"subscribe": topic, "kafka.bootstrap.servers": bootstrap})

    read = sum(
        len(chunk) for chunk in read_chunks(options, OffsetRange(topic, 0, 0, RANGE), chunk_values)
    )

    assert read == RANGE
    assert stats, "librdkafka emitted no statistics while the range was read"
    fetched = max(s["rxmsgs"] for s in stats)
    assert fetched - RANGE <= MAX_FETCHED_PAST_END, (
        f"reading offsets 0-{RANGE} fetched {fetched} records, {fetched - RANGE} past the range's "
        f"end (of {BEHIND} behind it)"
    )


def _keep(out: list[dict[str, Any]]) -> Callable[[str], None]:
    def cb(payload: str) -> None:
        out.append(json.loads(payload))

    return cb
