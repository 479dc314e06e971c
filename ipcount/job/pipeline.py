"""The job's queries (driver side): the Kafka source's partial counts -> watermark -> 5 s tumbling
count per IP -> the transactional sink, and the dead-letter query beside it."""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

from ipcount.checkpoint.offset_log import absolute_location, check_readable
from ipcount.checkpoint.shuffle import check_shuffle_partitions
from ipcount.config import RunMode, Settings
from ipcount.errors import ConfigError
from ipcount.job.job_queries import JobQueries
from ipcount.job.query_id import checkpoint_query_id
from ipcount.kafka.client import check_transaction_timeout
from ipcount.kafka.topics import missing_topics
from ipcount.queries import COUNTS_QUERY, DEAD_LETTER_QUERY, QUALITY_METRICS
from ipcount.sink.dead_letters import dead_letter_record_bytes
from ipcount.sink.fencing import fence_predecessors
from ipcount.sink.producer_config import default_transactional_id, task_transactional_id
from ipcount.sink.start_check import check_sink_history
from ipcount.sink.writer import sink_options
from ipcount.source.native_reader import check_read_path
from ipcount.source.options import source_options
from ipcount.source.pacing import tick_seconds

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame, SparkSession
    from pyspark.sql.streaming import DataStreamWriter, StreamingQuery

__all__ = [
    "Prepared",
    "prepare_start",
    "build_counts",
    "preflight",
    "start_job",
]

logger = logging.getLogger(__name__)


def _ms(seconds: float) -> int:
    return int(round(seconds * 1000))


def build_counts(combined: DataFrame, settings: Settings) -> DataFrame:
    """Watermark and count per (5 s window, ip, late) over the source's combined rows
    (output=counts: the read tasks already counted their records per window, client and late).

    A counted row's `event_time` is the newest event time among its records, so the watermark
    follows the true maximum event time. A late row (its window's result already emitted) rides
    on the batch's `late_before` instead: that window ends after `late_before`, so Spark keeps
    the row; it is counted under its own window (`window_start`) and leaves as a correction
    (late=true) with the first window that closes after it arrived.

    Heartbeat rows must reach `withWatermark`: a filter that drops them would be pushed below it
    (it does not reference the event-time column) and the watermark would never see them. So they
    are kept through the aggregation, counted as 0, and the zero-count groups dropped after it.
    The malformed / future tallies never reach a window or the watermark.

    The watermark moves in steps of gcd(window, delay) (the event time it is taken from is cut
    down to that step, inside the row's own window): a window still closes exactly when the
    newest event time passes its end plus the delay, but Spark, which runs one more batch
    whenever the watermark moves, runs it only where a window may close (by default once per
    5 s window, not once per second of event time).
    """
    from pyspark.sql import functions as F

    window_ms = _ms(settings.job.window_seconds)
    delay_ms = _ms(settings.job.watermark_delay_seconds)
    window = f"{window_ms} milliseconds"
    delay = f"{delay_ms} milliseconds"
    step_ms = math.gcd(window_ms, delay_ms)
    event_ms = F.unix_millis(F.col("event_time"))
    # The state's key is (window, window_start_ms, ip, late), as before the combiner existed:
    # checkpoints written by earlier versions keep working.
    counted = (
        combined.where(F.col("kind").isin("counted", "heartbeat"))
        .withColumn("window_start_ms", F.unix_millis(F.col("window_start")))
        .withColumn("late", F.coalesce(F.col("late"), F.lit(False)))
        .withColumn("event_time", F.timestamp_millis(event_ms - event_ms % F.lit(step_ms)))
        .withWatermark("event_time", delay)
        .groupBy(
            F.window("event_time", window), F.col("window_start_ms"), F.col("ip"), F.col("late")
        )
        .agg(F.sum("count").cast("long").alias("count"))
    )
    start = F.col("window_start_ms")
    return counted.where(F.col("count") > 0).select(
        F.timestamp_millis(start).alias("window_start"),
        F.timestamp_millis(start + F.lit(window_ms)).alias("window_end"),
        F.col("ip"),
        F.col("count"),
        F.col("late"),
    )


def _observe_quality(combined: DataFrame) -> DataFrame:
    from pyspark.sql import functions as F

    kind, count = F.col("kind"), F.col("count")

    def total(condition: Column) -> Column:
        return F.coalesce(F.sum(F.when(condition, count)), F.lit(0))

    return combined.observe(
        QUALITY_METRICS,
        total(~kind.isin("heartbeat", "lost")).alias("records"),
        total(kind == "malformed").alias("malformed"),
        total(kind == "future").alias("future"),
        total(kind == "lost").alias("lost"),
        total((kind == "counted") & F.col("late")).alias("late"),
        F.count(F.when(kind == "heartbeat", 1)).alias("heartbeats"),
    )


def preflight(settings: Settings) -> None:
    """Checks that fail fast with a clear message before Spark starts a query.

    Raises:
        ConfigError: missing topics, a transaction timeout above the broker's maximum, or
            job.native_helpers=on where a compiled helper is not built.
        BrokerError: the broker is unreachable.
    """
    needed = [settings.topics.source, settings.topics.sink, settings.topics.progress]
    if settings.job.late_corrections:
        needed.append(settings.topics.late)
        check_readable(settings.job.checkpoint_location)
    if settings.job.dead_letter:
        needed.append(settings.topics.dead_letter)
    missing = missing_topics(settings, needed)
    if missing:
        raise ConfigError(
            f"topic(s) {', '.join(missing)} do not exist on {settings.kafka.bootstrap_servers}; "
            "create them with `ipcount topics create` (or fix the [topics] settings)"
        )
    check_transaction_timeout(
        settings.kafka.to_librdkafka("producer"),
        settings.sink.transaction_timeout_ms,
        settings.kafka.connect_timeout_seconds,
    )
    logger.info("read tasks count through %s", check_read_path(settings.job.native_helpers))


def _sink_writer(
    rows: DataFrame, name: str, checkpoint: str, options: dict[str, str]
) -> DataStreamWriter:
    """The query `name` writing `rows` through the transactional sink with `options`, in append
    mode, its progress in `checkpoint`."""
    return (
        rows.writeStream.format("ipcount-kafka-txn")
        .outputMode("append")
        .queryName(name)
        .option("checkpointLocation", checkpoint)
        .options(**options)
    )


def _trigger(writer: DataStreamWriter, mode: RunMode, interval: float) -> DataStreamWriter:
    """AvailableNow in a bounded run, else a processing-time trigger every `interval` s."""
    if mode.available_now:
        return writer.trigger(availableNow=True)
    return writer.trigger(processingTime=f"{_ms(interval)} milliseconds")


@dataclass(frozen=True)
class Prepared:
    """What the counting query needs from Kafka before it starts (see `prepare_start`)."""

    query_id: str
    settings: Settings
    run_id: str


def prepare_start(
    settings: Settings, *, spark: SparkSession | None = None, mode: RunMode = RunMode()
) -> Prepared:
    """The Kafka side of a start, which needs no Spark for a local checkpoint (the job runs it
    while Spark starts): the queries' ids from their checkpoints, fencing the predecessors'
    transactions, and the sink history check of the counting query (`mode.new_query`:
    see sink.history).

    Raises:
        SinkHistoryError: the checkpoint and the sink's history disagree.
    """
    checkpoint = settings.job.checkpoint_location.rstrip("/")
    query_id = checkpoint_query_id(spark, checkpoint)
    # A predecessor killed inside a transaction would hold the progress topic's read_committed
    # readers back: end it first (both queries share that topic).
    ids = [query_id]
    if settings.job.dead_letter:
        ids.append(checkpoint_query_id(spark, checkpoint + "-dead-letter"))
    partitions = check_shuffle_partitions(checkpoint, settings.spark.shuffle_partitions)
    queries = [default_transactional_id(q) for q in ids]
    # Each sink task has its own transactional.id (both queries: one per shuffle partition).
    transactional_ids = queries + [
        task_transactional_id(t, p) for t in queries for p in range(partitions)
    ]
    fence_predecessors(
        settings.kafka.to_librdkafka("producer"),
        transactional_ids,
        settings.sink.transaction_timeout_ms,
        settings.sink.retry_deadline_seconds,
    )
    settings, run_id = check_sink_history(
        settings, query_id, checkpoint, settings.topics.sink, mode
    )
    return Prepared(query_id, settings, run_id)


def start_job(
    spark: SparkSession,
    settings: Settings,
    *,
    mode: RunMode = RunMode(),
    checked: bool = False,
    prepared: Prepared | None = None,
) -> JobQueries:
    """Start the counts query (and the dead-letter query when job.dead_letter is on) in `mode`
    (bounded or not, closing every window, a new query: see RunMode); `checked`: `preflight`
    already passed; `prepared`: `prepare_start` already ran for this start.

    Raises:
        SinkHistoryError: the checkpoint and the sink's history disagree.
    """
    if not checked:
        preflight(settings)
    if prepared is None:
        prepared = prepare_start(settings, spark=spark, mode=mode)
    checkpoint = settings.job.checkpoint_location.rstrip("/")
    query_id, settings, run_id = prepared.query_id, prepared.settings, prepared.run_id
    corrections = settings.job.late_corrections
    opts = source_options(
        settings,
        mode=mode,
        query_checkpoint=absolute_location(checkpoint),
        cores=spark.sparkContext.defaultParallelism,
        batch_interval_ms=0 if mode.available_now else _ms(settings.job.trigger_interval_seconds),
    )
    source = spark.readStream.format("ipcount-kafka").options(**opts).load()
    counts = build_counts(_observe_quality(source), settings)
    late_topic = settings.topics.late if corrections else None
    writer = _sink_writer(
        counts,
        COUNTS_QUERY,
        checkpoint,
        sink_options(
            settings,
            query_id,
            topic=settings.topics.sink,
            late_topic=late_topic,
            checkpoint=absolute_location(checkpoint),
            run_id=run_id,
        ),
    )
    # The source admits records once per job.trigger_interval_seconds itself (source.pacing), so
    # Spark's trigger ticks at a fraction of it.
    interval = settings.job.trigger_interval_seconds
    counts_query = _trigger(writer, mode, tick_seconds(interval) if interval > 0 else 0).start()
    logger.info(
        "started query %s (id %s) %s -> %s, checkpoint %s",
        COUNTS_QUERY,
        query_id,
        settings.topics.source,
        settings.topics.sink,
        checkpoint,
    )
    queries = JobQueries(counts_query)
    if settings.job.dead_letter:

        def dead_letter() -> StreamingQuery:
            return _start_dead_letter(
                spark, settings, checkpoint, checkpoint + "-dead-letter", mode
            )

        queries.pending, queries.live = dead_letter, not mode.available_now
    return queries


def _start_dead_letter(
    spark: SparkSession,
    settings: Settings,
    counts_checkpoint: str,
    checkpoint: str,
    mode: RunMode,
) -> StreamingQuery:
    """Records not counted (malformed, future), raw, to topics.dead_letter with their reason in
    the header `ipcount.reason`: a stateless query with its own checkpoint, following the counting
    query's batches (each record gets the verdict that query gave it)."""
    from pyspark.sql import functions as F

    query_id = checkpoint_query_id(spark, checkpoint)
    settings, run_id = check_sink_history(
        settings, query_id, checkpoint, settings.topics.dead_letter, mode
    )
    opts = source_options(
        settings,
        output="rejects",
        heartbeats=False,
        query_checkpoint=absolute_location(checkpoint),
        counts_checkpoint=absolute_location(counts_checkpoint),
        cores=spark.sparkContext.defaultParallelism,
    )
    bad = spark.readStream.format("ipcount-kafka").options(**opts).load()
    where = F.concat(
        F.col("topic"),
        F.lit("/"),
        F.col("partition").cast("string"),
        F.lit("@"),
        F.col("offset").cast("string"),
    )
    rejected = bad.select(F.col("key"), F.col("value"), F.col("reason"), where.alias("source"))
    # Sink tasks must get the same rows when a batch is replayed: hash-partitioned by where each
    # record came from, over the checkpoint's shuffle partitions (not by how the source split the
    # batch's offsets, which follows the cores of the job that planned it).
    rejected = rejected.repartition(F.col("source"))
    writer = _sink_writer(
        rejected,
        DEAD_LETTER_QUERY,
        checkpoint,
        sink_options(
            settings,
            query_id,
            topic=settings.topics.dead_letter,
            mode="raw",
            checkpoint=absolute_location(checkpoint),
            run_id=run_id,
            # A dead letter must be writable whatever the source held (one that cannot be
            # produced would fail the transaction on every replay): the writer bounds its key,
            # value and headers, and its headers say what was cut and where the whole is.
            max_record_bytes=dead_letter_record_bytes(settings),
            max_value_bytes=settings.job.dead_letter_max_bytes,
        ),
    )
    logger.info("started query %s -> %s", DEAD_LETTER_QUERY, settings.topics.dead_letter)
    return _trigger(writer, mode, settings.job.dead_letter_interval_seconds).start()
