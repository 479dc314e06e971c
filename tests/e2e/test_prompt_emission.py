"""When the job emits a window: right after the batch whose records closed it, not one trigger
interval later, and Spark runs no batch for a watermark move that closes no window."""

from __future__ import annotations

import json
import time
from collections import Counter
from typing import Any

from confluent_kafka import Producer

from ipcount.config import Settings
from ipcount.formats.accesslog import format_record
from ipcount.formats.avro import make_codec
from ipcount.job.pipeline import start_job
from ipcount.kafka.records import decode_records
from ipcount.kafka.topic_reader import TopicReader
from ipcount.kafka.topics import ensure_topics

T0 = 1_795_341_600_000  # a multiple of 5000: window starts are T0 + k * 5000
INTERVAL = 4.0


def _produce(settings: Settings, rows: list[tuple[str, int]]) -> None:
    """(ip, event offset ms from T0) on partition 0."""
    p = Producer({"bootstrap.servers": settings.kafka.bootstrap_servers, "linger.ms": 5})
    for ip, offset_ms in rows:
        ms = T0 + offset_ms
        p.produce(settings.topics.source, value=format_record(ip, ms).encode(), partition=0)
    assert p.flush(10) == 0


def _results(settings: Settings) -> Counter[tuple[int, str, int]]:
    codec = make_codec("single-object")
    conf = settings.kafka.to_librdkafka("consumer")
    with TopicReader(conf, settings.topics.sink) as reader:
        return Counter(
            (rec.window_start - T0, rec.ip, rec.count)
            for _, rec in decode_records(reader.read_to_end(30), codec)
        )


def _progress(query: Any) -> list[dict[str, Any]]:
    return [json.loads(p.json) for p in query.recentProgress]


def _wait_for(query: Any, check: Any, what: str, timeout: float = 90.0) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert query.exception() is None, query.exception()
        got = check()
        if got:
            return got
        time.sleep(0.2)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}")


def _read(progress: list[dict[str, Any]], ip_count: int) -> dict[str, Any] | None:
    """The batch that read `ip_count` input rows after the ones before."""
    data = [p for p in progress if p["numInputRows"] > 0]
    return data[ip_count] if len(data) > ip_count else None


def _emitting(progress: list[dict[str, Any]]) -> tuple[dict[str, Any], dict[str, Any]] | None:
    """The batch that read the second input and the first batch after it with output rows."""
    closing = _read(progress, 1)
    if closing is None:
        return None
    after = [p for p in progress if p["batchId"] > closing["batchId"]]
    emitting = next((p for p in after if int(p["sink"].get("numOutputRows", 0)) > 0), None)
    return None if emitting is None else (closing, emitting)


def _ts(p: dict[str, Any]) -> float:
    from datetime import datetime

    return datetime.fromisoformat(p["timestamp"].replace("Z", "+00:00")).timestamp()


def test_windows_are_emitted_right_after_the_batch_that_closed_them(spark, make_settings) -> None:  # type: ignore[no-untyped-def]
    settings = make_settings(
        f"job.trigger_interval_seconds={INTERVAL}",
        "job.idle_timeout_seconds=600",  # no heartbeat: only records move event time here
        "job.dead_letter=false",
        "topics.source_partitions=1",
    )
    ensure_topics(settings)
    _produce(settings, [("10.0.0.1", 1_000), ("10.0.0.1", 2_000), ("10.0.0.2", 3_000)])
    queries = start_job(spark, settings)
    query = queries.counts
    try:
        _wait_for(query, lambda: _read(_progress(query), 0), "the first batch")
        # 11 s closes [0 s, 5 s) (watermark delay 5 s).
        _produce(settings, [("10.0.0.3", 11_000)])
        _wait_for(query, lambda: _results(settings), "the first window's results")
        # Each sink task commits its share inside the batch, before Spark records the batch's
        # progress: wait for that too.
        closing, emitting = _wait_for(query, lambda: _emitting(_progress(query)), "its progress")
        assert emitting["batchId"] == closing["batchId"] + 1 and emitting["numInputRows"] == 0
        gap = _ts(emitting) - _ts(closing)
        # The emitting batch follows the closing one as soon as it ends, well inside the interval
        # (one trigger interval later before: the gap was the whole interval).
        assert gap < INTERVAL * 0.75, (gap, closing, emitting)
        # 13 s is in the same window as 11 s: the watermark stays where the 11 s record put it, no
        # window can close, and Spark runs no batch for it.
        _produce(settings, [("10.0.0.3", 13_000)])
        third = _wait_for(query, lambda: _read(_progress(query), 2), "the batch reading 13 s")
        time.sleep(INTERVAL / 2)
        later = [p for p in _progress(query) if p["batchId"] > third["batchId"]]
        assert later == [], later
        watermark = third["eventTime"]["watermark"]
        assert watermark == "2026-11-22T10:00:05.000Z", third["eventTime"]
    finally:
        for q in queries.all():
            q.stop()
    assert _results(settings) == Counter({(0, "10.0.0.1", 2): 1, (0, "10.0.0.2", 1): 1})


def test_the_dead_letter_query_runs_at_its_own_interval_and_follows_every_batch(  # type: ignore[no-untyped-def]
    spark, make_settings
) -> None:
    """Records every second, a counting batch each second; the dead-letter query runs every
    job.dead_letter_interval_seconds, each run following every counting batch since its last:
    the malformed record fed with each second's records is dead-lettered all the same."""
    settings = make_settings(
        "job.trigger_interval_seconds=1",
        "job.dead_letter_interval_seconds=4",
        "topics.source_partitions=1",
    )
    ensure_topics(settings)
    queries = start_job(spark, settings)
    bad = 0
    try:
        for second in range(20):
            _produce(settings, [(f"10.0.1.{second % 3}", second * 1_000)])
            p = Producer({"bootstrap.servers": settings.kafka.bootstrap_servers})
            p.produce(settings.topics.source, value=b"not an access line %d" % second, partition=0)
            assert p.flush(10) == 0
            bad += 1
            queries.advance()
            time.sleep(1.0)

        def all_dead_lettered() -> bool:
            queries.advance()
            return _dead_letters(settings) >= bad

        _wait_for(queries.counts, all_dead_lettered, "every dead letter")
        counting = [p for p in _progress(queries.counts) if p["numInputRows"] > 0]
        dead_letter = queries.dead_letter
        assert dead_letter is not None
        runs = [_ts(p) for p in _progress(dead_letter)]
    finally:
        for q in queries.all():
            q.stop()
    assert _dead_letters(settings) == bad
    assert len(counting) >= 8, len(counting)
    # Started once the counting query caught up, then on Spark's 4 s ticks, not with each
    # counting batch (a run that overran a tick is followed at once: hence the + 2).
    span = runs[-1] - runs[0]
    assert span >= 8, runs
    assert len(runs) <= span / 4 + 2, (len(runs), span, runs)


def _dead_letters(settings: Settings) -> int:
    conf = settings.kafka.to_librdkafka("consumer")
    with TopicReader(conf, settings.topics.dead_letter) as reader:
        return sum(1 for _ in reader.read_to_end(30))
