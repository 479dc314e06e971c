"""Benchmark of the transactional sink's commit path: committed results/s for one sink task's share
of N results (encoded and committed in the task's own Kafka transaction, as on an executor)."""

from __future__ import annotations

import argparse
import statistics
import time
import uuid
from dataclasses import replace

from confluent_kafka import Producer

from ipcount.bench.options import Say
from ipcount.bench.workspace import own_broker
from ipcount.config import Settings, load_settings
from ipcount.formats.avro import SingleObjectCodec
from ipcount.kafka.topic_reader import TopicReader
from ipcount.kafka.topics import ensure_topics
from ipcount.sink.fencing import fence_predecessors
from ipcount.sink.marker import ProgressMarker
from ipcount.sink.producer_config import (
    TxnConfig,
    default_transactional_id,
    new_run_id,
    task_transactional_id,
)
from ipcount.sink.runs import announce_run
from ipcount.sink.task_commit import task_config
from ipcount.sink.transaction import TxnSession

__all__ = ["bench_one", "run_sink"]

W = 5000
T0 = 1_700_000_000_000
# The hand-over: results a commit, and turns of the two workers (each commit fenced).
_HAND_OVER_RESULTS = 5000
_HAND_OVERS = 4


def _settings(bootstrap: str, partitions: int) -> Settings:
    tag = uuid.uuid4().hex[:8]
    return load_settings(
        None,
        env={},
        overrides=[
            f"kafka.bootstrap_servers={bootstrap}",
            f"topics.source=bench-src-{tag}",
            f"topics.sink=bench-sink-{tag}",
            f"topics.progress=bench-progress-{tag}",
            f"topics.late=bench-late-{tag}",
            f"topics.dead_letter=bench-dlq-{tag}",
            f"topics.sink_partitions={partitions}",
        ],
    )


def _rows(n: int) -> list[dict[str, object]]:
    # Distinct (window, ip) results, as one micro-batch of the job would emit.
    return [
        {
            "window_start": T0 + (i // 65536) * W,
            "window_end": T0 + (i // 65536 + 1) * W,
            "ip": f"10.{(i >> 16) & 255}.{(i >> 8) & 255}.{i & 255}",
            "count": 1 + i % 97,
        }
        for i in range(n)
    ]


def _sink_end(settings: Settings) -> int:
    with TopicReader(settings.kafka.to_librdkafka("consumer"), settings.topics.sink) as reader:
        return sum(high for _, high in reader.watermarks().values())


def bench_one(session: TxnSession, settings: Settings, batch_id: int, n: int) -> dict[str, float]:
    """Encode and commit one task's batch of n results; returns timings in seconds."""
    rows = _rows(n)
    codec = SingleObjectCodec()
    t0 = time.perf_counter()
    records = [(str(row["ip"]).encode(), codec.encode(row)) for row in rows]
    t1 = time.perf_counter()
    before = _sink_end(settings)
    t3 = time.perf_counter()
    outcome = session.commit_batch(batch_id, records)
    t4 = time.perf_counter()
    written = _sink_end(settings) - before
    if outcome.status != "committed" or outcome.records != n or written < n:
        raise SystemExit(
            f"batch {batch_id}: {outcome}, sink grew by {written} offsets, expected {n}"
        )
    return {"encode": t1 - t0, "commit": t4 - t3}


def run_sink(args: argparse.Namespace, say: Say) -> int:
    """`ipcount bench sink`: one transaction per --sizes entry (own broker unless --bootstrap);
    one line each to `say`."""
    sizes = [int(s.replace("_", "")) for s in args.sizes.split(",") if s.strip()]

    with own_broker(args.bootstrap, "bench-sink-") as bootstrap:
        settings = _settings(bootstrap, args.partitions)
        ensure_topics(settings)
        qid = f"bench-{uuid.uuid4().hex[:8]}"
        # One sink task's session (sink partition 0): what each executor's task does.
        task = task_config(
            TxnConfig(
                topic=settings.topics.sink,
                progress_topic=settings.topics.progress,
                query_id=qid,
                transactional_id=default_transactional_id(qid),
                producer_conf=settings.kafka.to_librdkafka("producer"),
                consumer_conf=settings.kafka.to_librdkafka("consumer"),
                transaction_timeout_ms=settings.sink.transaction_timeout_ms,
                retry_deadline_seconds=120.0,
            ),
            0,
        )
        session = TxnSession(task)
        t = time.perf_counter()
        session.start()
        say(
            f"broker {bootstrap}; sink partitions {args.partitions}; "
            f"producer init + progress read {time.perf_counter() - t:.3f}s"
        )
        for batch_id, n in enumerate(sizes):
            r = bench_one(session, settings, batch_id, n)
            say(
                f"results={n} encode={r['encode']:.3f}s ({n / r['encode']:,.0f}/s) "
                f"commit={r['commit']:.3f}s "
                f"committed_results_per_s={n / r['commit']:,.0f}"
            )
        session.close()
        say(_fence_line(task))
        for markers in [int(h.replace("_", "")) for h in args.history.split(",") if h.strip()]:
            say(_hand_over(settings, task, markers))
    return 0


def _fence_line(task: TxnConfig, ids: int = 6, times: int = 5) -> str:
    """What a job's start spends ending its predecessors' transactions: `fence_predecessors` of
    `ids` new transactional ids (the default job's: two queries, each with two sink tasks)."""
    took = []
    for _ in range(times):
        tids = [f"bench-fence-{uuid.uuid4().hex[:8]}" for _ in range(ids)]
        t = time.perf_counter()
        fence_predecessors(dict(task.producer_conf), tids, task.transaction_timeout_ms, 30.0)
        took.append(time.perf_counter() - t)
    return (
        f"fence_predecessors ids={ids} seconds={statistics.median(took):.3f} "
        f"(median of {times}) slowest={max(took):.3f}"
    )


def _hand_over(settings: Settings, task: TxnConfig, markers: int) -> str:
    """Two sessions of one sink partition commit in turn (each commit fenced by the other's last
    one), after `markers` markers of another query: a query of its own on fresh topics."""
    settings = _settings(settings.kafka.bootstrap_servers, settings.topics.sink_partitions)
    ensure_topics(settings)
    qid = f"bench-{uuid.uuid4().hex[:8]}"
    run_id = new_run_id()
    task = replace(
        task,
        topic=settings.topics.sink,
        progress_topic=settings.topics.progress,
        query_id=qid,
        transactional_id=task_transactional_id(default_transactional_id(qid), 0),
        run_id=run_id,
    )
    announce_run(task.producer_conf, task.progress_topic, qid, run_id)
    _other_query_markers(settings, markers)
    codec = SingleObjectCodec()
    records = [(str(row["ip"]).encode(), codec.encode(row)) for row in _rows(_HAND_OVER_RESULTS)]
    first = TxnSession(task)  # the worker that wrote the partition's first batch
    first.commit_batch(0, records)
    first.close()
    workers = (TxnSession(task), TxnSession(task))
    fenced: list[float] = []
    own: list[float] = []
    try:
        for batch_id in range(1, 3 + 2 * _HAND_OVERS + _HAND_OVERS):
            # Batches 1 and 2: each worker's first start; then turn by turn; then one worker alone.
            alone = batch_id >= 3 + 2 * _HAND_OVERS
            worker = workers[0] if alone else workers[batch_id % 2]
            t = time.perf_counter()
            outcome = worker.commit_batch(batch_id, records)
            took = time.perf_counter() - t
            if outcome.status != "committed":
                raise SystemExit(f"hand-over batch {batch_id}: {outcome}")
            if batch_id >= 3:
                (own if alone else fenced).append(took)
    finally:
        for worker in workers:
            worker.close()
    return (
        f"hand_over markers_before={markers} results={_HAND_OVER_RESULTS} "
        f"commit_after_the_other_worker={statistics.median(fenced):.3f}s "
        f"commit_after_its_own={statistics.median(own):.3f}s "
        f"(medians of {len(fenced)} and {len(own)}) "
        f"slowest_after_the_other_worker={max(fenced):.3f}s"
    )


def _other_query_markers(settings: Settings, n: int) -> None:
    """`n` committed markers of another query (two sink tasks' and the query's a batch)."""
    producer = Producer(settings.kafka.to_librdkafka("producer"))
    for i in range(n):
        marker = ProgressMarker(
            query_id="bench-other",
            batch_id=i // 3,
            run_id="bench",
            records=5000,
            topic=settings.topics.sink,
            transactional_id="bench-other",
            committed_at_ms=T0,
            sink_partition=None if i % 3 == 2 else i % 3,
            source_end={settings.topics.source: {"0": i}},
        )
        producer.produce(settings.topics.progress, marker.encode(), marker.key)
        producer.poll(0)
    if producer.flush(60):
        raise SystemExit(f"{n} progress markers were not acknowledged within 60 s")
