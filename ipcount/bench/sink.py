"""Benchmark of the transactional sink's commit path: committed results/s for one sink task's share
of N results (encoded and committed in the task's own Kafka transaction, as on an executor)."""

from __future__ import annotations

import argparse
import time
import uuid

from ipcount.bench.options import Say
from ipcount.bench.workspace import own_broker
from ipcount.config import Settings, load_settings
from ipcount.formats.avro import SingleObjectCodec
from ipcount.kafka.topic_reader import TopicReader
from ipcount.kafka.topics import ensure_topics
from ipcount.sink.producer_config import TxnConfig, default_transactional_id
from ipcount.sink.task_commit import task_config
from ipcount.sink.transaction import TxnSession

__all__ = ["bench_one", "run_sink"]

W = 5000
T0 = 1_700_000_000_000


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
    return 0
