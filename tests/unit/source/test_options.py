"""Kafka source options, client configs, schema and picklability (no broker)."""

from __future__ import annotations

import pickle

import pyarrow as pa
import pytest
from pyspark.sql.pandas.types import to_arrow_schema

from ipcount.errors import ConfigError, SourceError
from ipcount.source.arrow_schema import RECORDS_ARROW_SCHEMA
from ipcount.source.data_source import KafkaDataSource
from ipcount.source.offsets import OffsetRange
from ipcount.source.options import parse_options
from ipcount.source.partition_reader import heartbeat_batch
from ipcount.source.reader import KafkaInputPartition, KafkaStreamReader
from ipcount.source.schema import SCHEMA

BASE = {"subscribe": "a, b", "kafka.bootstrap.servers": "127.0.0.1:9"}


def test_defaults_like_sparks_kafka_source() -> None:
    opts = parse_options(BASE)
    assert opts.topics == ("a", "b")
    assert opts.starting_offsets == "latest"
    assert opts.max_offsets_per_trigger is None and opts.min_partitions is None
    assert opts.fail_on_data_loss is True
    assert opts.idle_timeout_ms == 0 and not opts.heartbeats
    assert opts.read_committed


def test_options_are_case_insensitive_and_parsed() -> None:
    opts = parse_options(
        {
            **BASE,
            "STARTINGOFFSETS": "earliest",
            "maxOffsetsPerTrigger": "500",
            "minpartitions": "6",
            "MaxRecordsPerPartition": "100000",
            "failOnDataLoss": "False",
            "idleTimeoutMs": "2000",
            "heartbeatMaxAdvanceMs": "12000",
            "kafkaConsumer.pollTimeoutMs": "5000",
        }
    )
    assert (opts.starting_offsets, opts.max_offsets_per_trigger, opts.min_partitions) == (
        "earliest",
        500,
        6,
    )
    assert opts.max_records_per_partition == 100_000
    assert not opts.fail_on_data_loss and opts.heartbeats
    assert (opts.heartbeat_max_advance_ms, opts.poll_timeout_ms) == (12_000, 5_000)


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        ({"maxOffsetPerTrigger": "5"}, "did you mean 'maxoffsetspertrigger'"),
        ({"subscribePattern": "a.*"}, "not supported"),
        ({"kafka.auto.offset.reset": "earliest"}, "startingOffsets"),
        ({"kafka.enable.auto.commit": "true"}, "checkpoint"),
        ({"kafka.isolation.level": "committed"}, "read_committed or read_uncommitted"),
        ({"maxOffsetsPerTrigger": "0"}, ">= 1"),
        ({"minPartitions": "many"}, "must be an integer"),
        ({"maxRecordsPerPartition": "0"}, ">= 1"),
        ({"failOnDataLoss": "maybe"}, "true or false"),
        ({"startingOffsets": '{"c": {"0": 1}}'}, "not in subscribe"),
        ({"subscribe": " , "}, "subscribe is required"),
        ({"subscribe": "a,a"}, "twice"),
        ({"kafka.bootstrap.servers": ""}, "bootstrap.servers is required"),
    ],
)
def test_bad_options_name_the_option(extra: dict[str, str], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        parse_options({**BASE, **extra})


def test_consumer_configs_default_and_override() -> None:
    conf = parse_options(BASE).consumer_conf("executor")
    assert conf["isolation.level"] == "read_committed"
    # Raised only for noida-db, which ignores fetch size limits; Apache Kafka keeps its default.
    assert "receive.message.max.bytes" not in conf
    noida = parse_options({**BASE, "brokerQuirks": "noida-db"}).consumer_conf("executor")
    assert noida["receive.message.max.bytes"] == "1000000000"
    with pytest.raises(ConfigError, match="broker_quirks"):
        parse_options({**BASE, "brokerQuirks": "kafka"})
    assert conf["auto.offset.reset"] == "error"
    assert conf["enable.auto.commit"] == "false"
    assert conf["allow.auto.create.topics"] == "false"
    assert conf["group.id"].startswith("ipcount-source-executor-")
    assert parse_options(BASE).consumer_conf("driver")["auto.offset.reset"] == "earliest"
    custom = parse_options(
        {
            **BASE,
            "kafka.isolation.level": "read_uncommitted",
            "kafka.receive.message.max.bytes": "2000000",
            "kafka.group.id": "mine",
            "kafka.security.protocol": "SASL_SSL",
        }
    )
    conf = custom.consumer_conf("executor")
    assert not custom.read_committed
    assert (conf["isolation.level"], conf["receive.message.max.bytes"], conf["group.id"]) == (
        "read_uncommitted",
        "2000000",
        "mine",
    )
    admin = custom.admin_conf()
    assert admin["security.protocol"] == "SASL_SSL"
    assert "isolation.level" not in admin and "group.id" not in admin


def test_read_tasks_fetch_a_little_ahead_unless_told_otherwise() -> None:
    # A bounded window ahead (what is queued when a range ends was fetched for nothing), refilled
    # within 10 ms rather than librdkafka's 1 s backoff (tests/integration/source/
    # test_fetch_ahead.py reads a range of a longer log).
    conf = parse_options(BASE).consumer_conf("executor")
    assert (conf["queued.min.messages"], conf["fetch.queue.backoff.ms"]) == ("20000", "10")
    mine = parse_options({**BASE, "kafka.queued.min.messages": "5000"})
    assert mine.consumer_conf("executor")["queued.min.messages"] == "5000"


def test_arrow_schema_matches_what_spark_expects() -> None:
    # Spark rejects batches whose Arrow schema differs (DATA_SOURCE_RETURN_SCHEMA_MISMATCH).
    assert RECORDS_ARROW_SCHEMA.equals(to_arrow_schema(SCHEMA, timezone="UTC"))
    batch = heartbeat_batch("t", 1_700_000_000_123)
    assert batch.schema.equals(RECORDS_ARROW_SCHEMA)
    row = batch.to_pylist()[0]
    assert row["heartbeat"] is True and row["key"] is None and row["value"] is None
    assert row["timestamp"].timestamp() == 1_700_000_000.123
    assert (row["partition"], row["offset"], row["timestampType"]) == (-1, -1, -1)


def test_reader_and_partitions_pickle_without_clients() -> None:
    source = KafkaDataSource({**BASE})
    assert source.name() == "ipcount-kafka" and source.schema() == SCHEMA
    reader = source.streamReader(SCHEMA)
    assert isinstance(reader, KafkaStreamReader)
    reader._offsets  # creates the (lazy) offset reader, still without Kafka clients
    clone = pickle.loads(pickle.dumps(reader))  # noqa: S301
    assert clone.options == reader.options and clone._kafka is None
    part = KafkaInputPartition(OffsetRange("a", 0, 1, 5), heartbeat_ms=9)
    clone_part = pickle.loads(pickle.dumps(part))  # noqa: S301
    assert (clone_part.range, clone_part.heartbeat_ms) == (OffsetRange("a", 0, 1, 5), 9)


def test_user_schema_is_refused() -> None:
    from pyspark.sql.types import StringType, StructField, StructType

    with pytest.raises(SourceError, match="fixed schema"):
        KafkaDataSource({**BASE}).streamReader(StructType([StructField("value", StringType())]))


COUNTS = {**BASE, "eventTimeFormat": "nginx-combined", "output": "counts"}


def test_the_combiner_outputs_have_their_own_schemas_matching_their_arrow_batches() -> None:
    from ipcount.source.arrow_schema import COUNTS_ARROW_SCHEMA, REJECTS_ARROW_SCHEMA
    from ipcount.source.combiner import counts_heartbeat
    from ipcount.source.schema import COUNTS_SCHEMA, REJECTS_SCHEMA

    assert KafkaDataSource({**COUNTS}).schema() == COUNTS_SCHEMA
    assert KafkaDataSource({**COUNTS, "output": "rejects"}).schema() == REJECTS_SCHEMA
    # The Arrow forms the read tasks build their batches with, as Spark checks them.
    assert COUNTS_ARROW_SCHEMA.equals(to_arrow_schema(COUNTS_SCHEMA, timezone="UTC"))
    assert REJECTS_ARROW_SCHEMA.equals(to_arrow_schema(REJECTS_SCHEMA, timezone="UTC"))
    ts = pa.timestamp("us", tz="UTC")
    assert COUNTS_ARROW_SCHEMA.types == [pa.string(), ts, pa.string(), pa.int64(), ts, pa.bool_()]
    assert REJECTS_ARROW_SCHEMA.types == [
        pa.binary(), pa.binary(), pa.string(), pa.int32(), pa.int64(), ts, pa.string()
    ]  # fmt: skip
    assert counts_heartbeat(1_700_000_000_000).schema.equals(COUNTS_ARROW_SCHEMA)
    # maxRecordBytes is retired (a record's length never decides whether it counts), still
    # accepted so a job that sets it starts.
    opts = parse_options({**COUNTS, "windowMs": "10000", "maxRecordBytes": "100"})
    assert (opts.output, opts.window_ms) == ("counts", 10_000)
    assert opts.late_corrections is True
    assert parse_options({**COUNTS, "lateCorrections": "false"}).late_corrections is False


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        ({"output": "lines"}, "output='lines' must be one of records, counts, rejects"),
        ({"eventTimeFormat": "kafka-timestamp"}, "needs eventTimeFormat=nginx-combined"),
        ({"maxFutureSkewMs": "300000"}, "needs option queryCheckpoint"),
        ({"lateCorrections": "maybe"}, "lateCorrections='maybe' must be true or false"),
        ({"windowMs": "0"}, "windowMs=0 must be >= 1"),
    ],
)
def test_bad_combiner_options_name_the_option(extra: dict[str, str], message: str) -> None:
    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace(")", r"\)")):
        parse_options({**COUNTS, **extra})
    # With the reading query's checkpoint, a skew bound is fine: the batch time comes from it.
    if "maxFutureSkewMs" in extra:
        parse_options({**COUNTS, **extra, "queryCheckpoint": "/tmp/ckpt"})


def test_the_jobs_source_options_parse_back_to_its_settings() -> None:
    # source_options (config -> Spark options) and parse_options (Spark options -> SourceOptions)
    # share one table: every option the job sets is one the source reads, to the value set.
    from ipcount.config import load_settings
    from ipcount.source.options import source_options

    settings = load_settings(None, env={}, overrides=["kafka.broker_quirks=none"])
    settings = settings.replace("job", min_partitions=4, max_bytes_per_batch=2048)
    raw = source_options(settings, output="counts", query_checkpoint="/tmp/q")
    opts = parse_options(raw)
    job = settings.job
    assert opts.topics == (settings.topics.source,)
    assert (opts.output, opts.event_time_format) == ("counts", "nginx-combined")
    assert opts.window_ms == round(job.window_seconds * 1000)
    assert opts.watermark_delay_ms == round(job.watermark_delay_seconds * 1000)
    assert opts.max_future_skew_ms == round(job.max_future_skew_seconds * 1000)
    assert opts.idle_timeout_ms == round(job.idle_timeout_seconds * 1000)
    assert (opts.min_partitions, opts.max_records_per_partition) == (4, None)
    assert (opts.max_offsets_per_trigger, opts.max_bytes_per_batch) == (
        job.max_offsets_per_trigger,
        2048,
    )
    assert (opts.query_checkpoint, opts.counts_checkpoint) == ("/tmp/q", "")
    assert opts.fail_on_data_loss is job.fail_on_data_loss
    assert opts.late_corrections is job.late_corrections
    assert opts.broker_quirks == "none"


def test_by_default_a_batch_gets_twice_as_many_read_tasks_as_spark_has_cores() -> None:
    from ipcount.config import load_settings
    from ipcount.source.options import source_options

    settings = load_settings(None, env={}, overrides=["kafka.broker_quirks=none"])
    assert settings.job.min_partitions == 0  # auto
    assert (
        parse_options(source_options(settings, cores=2, query_checkpoint="/q")).min_partitions == 4
    )
    assert (
        parse_options(source_options(settings, cores=8, query_checkpoint="/q")).min_partitions == 16
    )
    # Unknown cores: one task per partition, as Spark's Kafka source does.
    assert parse_options(source_options(settings, query_checkpoint="/q")).min_partitions is None
    # A setting wins over the cores.
    one = settings.replace("job", min_partitions=1)
    assert parse_options(source_options(one, cores=2, query_checkpoint="/q")).min_partitions == 1
    # Auto splits only large ranges; a setting splits as Spark's minPartitions does.
    auto = parse_options(source_options(settings, cores=2, query_checkpoint="/q"))
    assert auto.min_split_records == 50_000
    assert (
        parse_options(source_options(one, cores=2, query_checkpoint="/q")).min_split_records is None
    )


def test_an_unset_option_takes_its_one_default() -> None:
    from ipcount.config import MAX_BYTES_PER_BATCH

    opts = parse_options(BASE)
    assert opts.max_bytes_per_batch == MAX_BYTES_PER_BATCH == 16 * 1024 * 1024
    assert (opts.poll_timeout_ms, opts.heartbeat_max_advance_ms) == (120_000, 60_000)
    assert (opts.heartbeat_interval_ms, opts.window_ms, opts.output) == (1_000, 5_000, "records")
    with pytest.raises(ConfigError, match=r"option maxBytesPerBatch=1023 must be >= 1024"):
        parse_options({**BASE, "maxBytesPerBatch": "1023"})
