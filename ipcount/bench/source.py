"""Benchmark of the Kafka source: Spark read rate (records/s) next to raw confluent-kafka
consumption of the same topic, in one run. Pre-loads N nginx access records into a fresh topic."""

from __future__ import annotations

import argparse
import logging
import random
import tempfile
import time
import uuid
from typing import Any

from confluent_kafka import Consumer, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from ipcount.bench.options import Say
from ipcount.bench.workspace import own_broker
from ipcount.config import load_settings
from ipcount.formats.accesslog import format_record
from ipcount.kafka.client import with_client_logging
from ipcount.kafka.quirks import broker_quirks
from ipcount.source.data_source import KafkaDataSource
from ipcount.source.offsets import OffsetRange
from ipcount.source.reader import KafkaInputPartition
from ipcount.source.schema import SCHEMA

__all__ = ["run_source"]

logger = logging.getLogger(__name__)

_PATHS = ("/", "/index.html", "/api/v1/items?page=2", "/static/app.js", "/login", "/cart/checkout")
_REFERERS = ("-", "https://www.example.com/", "https://shop.example.com/products/42?ref=home")
_AGENTS = (
    "Mozilla/5.0 (X11; Linux x86_64; rv:128.0) Gecko/20100101 Firefox/128.0",
    "Mozilla/5.0 (Windows NT 10.0; Win64; x64) AppleWebKit/537.36",
    "curl/8.5.0",
)


def _records(n: int, seed: int = 1) -> Any:
    """(key, value, timestamp ms) of n realistic access records (~150 bytes), 1 ms apart."""
    rng = random.Random(seed)
    ips = [
        f"{rng.randint(1, 223)}.{rng.randint(0, 255)}.{rng.randint(0, 255)}.{rng.randint(1, 254)}"
        for _ in range(10_000)
    ]
    start = int(time.time() * 1000) - n  # one record per ms of event time, ending now
    for i in range(n):
        ip = ips[
            min(int(rng.paretovariate(1.2)) - 1, len(ips) - 1) if i % 3 else rng.randrange(len(ips))
        ]
        event_ms = start + i
        line = format_record(
            ip,
            event_ms,
            path=rng.choice(_PATHS),
            status=rng.choice((200, 200, 200, 304, 404)),
            body_bytes=rng.randint(200, 9000),
            referer=rng.choice(_REFERERS),
            user_agent=rng.choice(_AGENTS),
        )
        yield ip.encode(), line.encode(), event_ms


def _preload(bootstrap: str, topic: str, partitions: int, n: int) -> tuple[float, int]:
    admin = AdminClient(with_client_logging({"bootstrap.servers": bootstrap}))
    new = NewTopic(
        topic, num_partitions=partitions, replication_factor=1, config={"retention.ms": "-1"}
    )
    for fut in admin.create_topics([new]).values():
        fut.result(timeout=30)
    producer = Producer(
        with_client_logging(
            {
                "bootstrap.servers": bootstrap,
                "linger.ms": "50",
                "batch.size": "1000000",
                "queue.buffering.max.messages": "1000000",
            }
        )
    )
    t0 = time.perf_counter()
    size = 0
    for i, (key, value, ts) in enumerate(_records(n)):
        size += len(value)
        while True:
            try:
                producer.produce(topic, key=key, value=value, timestamp=ts)
                break
            except BufferError:
                producer.poll(0.05)
        if i % 10_000 == 0:
            producer.poll(0)
    if producer.flush(120):
        raise SystemExit("pre-load: records still undelivered after 120 s")
    return n / (time.perf_counter() - t0), size


def _raw_consume(bootstrap: str, topic: str, ends: dict[int, int]) -> float:
    consumer = Consumer(
        with_client_logging(
            {
                "bootstrap.servers": bootstrap,
                "group.id": f"bench-raw-{uuid.uuid4().hex[:8]}",
                "enable.auto.commit": "false",
                **broker_quirks({"bootstrap.servers": bootstrap}).consumer_defaults(),
            }
        )
    )
    tps = [TopicPartition(topic, p, 0) for p in ends]
    t0 = time.perf_counter()
    consumer.assign(tps)
    n = 0
    try:
        while True:
            msgs = consumer.consume(50_000, 0.5)
            for m in msgs:
                m.value()
            n += len(msgs)
            if all(tp.offset >= ends[tp.partition] for tp in consumer.position(tps)):
                break
    finally:
        consumer.close()
    return n / (time.perf_counter() - t0)


def _source_read(options: dict[str, str], topic: str, ends: dict[int, int]) -> float:
    """The source's executor read path in this process (consume + Arrow), without Spark."""
    reader = KafkaDataSource(options).streamReader(SCHEMA)
    # Warm up: the first Arrow conversion in a process imports pandas (through pyarrow), ~1-2 s;
    # a reused Spark Python worker pays that once.
    first = next(iter(ends))
    for _ in reader.read(KafkaInputPartition(OffsetRange(topic, first, 0, min(100, ends[first])))):
        pass
    t0 = time.perf_counter()
    n = 0
    for partition, end in ends.items():
        for batch in reader.read(KafkaInputPartition(OffsetRange(topic, partition, 0, end))):
            n += batch.num_rows
    return n / (time.perf_counter() - t0)


def _spark_query(spark: Any, options: dict[str, str], n: int) -> dict[str, Any]:
    """One AvailableNow query reading the whole topic, counting records per partition."""
    reader = spark.readStream.format("ipcount-kafka")
    for key, value in options.items():
        reader = reader.option(key, value)
    counts = reader.load().groupBy("partition").count()
    with tempfile.TemporaryDirectory(prefix="bench-source-ckpt-") as ckpt:
        name = f"bench_source_{uuid.uuid4().hex[:8]}"
        t0 = time.perf_counter()
        query = (
            counts.writeStream.outputMode("complete")
            .format("memory")
            .queryName(name)
            .option("checkpointLocation", ckpt)
            .trigger(availableNow=True)
            .start()
        )
        query.awaitTermination()
        wall = time.perf_counter() - t0
        if query.exception() is not None:
            raise SystemExit(f"Spark query failed: {query.exception()}")
        progress = [p for p in query.recentProgress if p.numInputRows]
        total = spark.table(name).agg({"count": "sum"}).collect()[0][0]
    if total != n:
        raise SystemExit(f"Spark counted {total} records, expected {n}")
    phases: dict[str, float] = {}
    for p in progress:
        for phase, ms in p.durationMs.items():
            phases[phase] = phases.get(phase, 0.0) + ms / 1000
    return {"wall": wall, "batches": len(progress), "phases": phases}


def _report_spark(run: int, result: dict[str, Any], n: int) -> list[str]:
    label = "cold" if run == 0 else "warm"
    busy = result["phases"].get("triggerExecution", 0.0)
    phases = ", ".join(f"{k} {v:.1f}s" for k, v in sorted(result["phases"].items()))
    return [
        f"spark source #{run + 1} {n / result['wall']:>9,.0f} records/s  (AvailableNow, count by "
        f"partition, {result['wall']:.1f} s wall with query start, {result['batches']} batches, "
        f"{label} Python workers)",
        f"  in batches     {n / busy:>10,.0f} records/s  (batch durations only)",
        f"  phases         {phases}",
    ]


def run_source(args: argparse.Namespace, say: Say) -> int:
    """`ipcount bench source`: pre-load, then each read rate, a line to `say` (own broker unless
    --bootstrap)."""
    with own_broker(args.bootstrap, "bench-source-broker-") as bootstrap:
        return _run(args, bootstrap, say)


def _run(args: argparse.Namespace, bootstrap: str, say: Say) -> int:
    topic = f"bench-source-{uuid.uuid4().hex[:8]}"
    try:
        produce_rate, size = _preload(bootstrap, topic, args.partitions, args.records)
        admin = AdminClient(with_client_logging({"bootstrap.servers": bootstrap}))
        md = admin.list_topics(topic, timeout=10).topics[topic]
        probe = Consumer(
            with_client_logging({"bootstrap.servers": bootstrap, "group.id": "bench-probe"})
        )
        ends = {
            p: probe.get_watermark_offsets(TopicPartition(topic, p), timeout=10)[1]
            for p in md.partitions
        }
        probe.close()
        options = {
            "kafka.bootstrap.servers": bootstrap,
            "subscribe": topic,
            "startingOffsets": "earliest",
        }
        if args.max_offsets_per_trigger:
            options["maxOffsetsPerTrigger"] = str(args.max_offsets_per_trigger)
        say(
            f"records          {args.records:,} in {args.partitions} partitions "
            f"({size / args.records:.0f} B/record, {size / 1e6:.0f} MB); broker {bootstrap}"
        )
        say(f"produce          {produce_rate:>10,.0f} records/s  (pre-load, one producer)")
        raw = _raw_consume(bootstrap, topic, ends)
        say(f"raw consume      {raw:>10,.0f} records/s  (confluent-kafka, 1 consumer)")
        read = _source_read(options, topic, ends)
        say(f"source read()    {read:>10,.0f} records/s  (source executor read path, no Spark)")
        from ipcount.job.session import build_session

        settings = load_settings(None, env={}, overrides=[f"spark.master={args.master}"])
        session = build_session(settings, {"spark.sql.shuffle.partitions": "2"})
        try:
            for i in range(args.spark_runs):
                result = _spark_query(session, options, args.records)
                for line in _report_spark(i, result, args.records):
                    say(line)
        finally:
            session.stop()
        return 0
    finally:
        if args.bootstrap:
            admin = AdminClient(with_client_logging({"bootstrap.servers": args.bootstrap}))
            try:
                for fut in admin.delete_topics([topic]).values():
                    fut.result(timeout=30)
            except KafkaException as exc:
                logger.warning("could not delete benchmark topic %s: %s", topic, exc)
