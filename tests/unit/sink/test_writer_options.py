"""The sink's option parsing and input-schema check (driver side, no Spark session, no broker)."""

from __future__ import annotations

import pytest
from pyspark.sql.types import (
    BinaryType,
    DoubleType,
    LongType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

from ipcount.config import load_settings
from ipcount.errors import ConfigError, SchemaError
from ipcount.sink.data_source import KafkaTxnDataSource
from ipcount.sink.writer import KafkaTxnStreamWriter, sink_options

COUNTS = StructType(
    [
        StructField("window_start", TimestampType()),
        StructField("window_end", TimestampType()),
        StructField("ip", StringType()),
        StructField("count", LongType()),
    ]
)
RAW = StructType([StructField("key", BinaryType()), StructField("value", BinaryType())])


def _opts(**extra: str) -> dict[str, str]:
    base = {
        "topic": "out",
        "progressTopic": "progress",
        "queryId": "q1",
        "kafka.bootstrap.servers": "127.0.0.1:9092",
    }
    base.update(extra)
    return base


def test_name() -> None:
    assert KafkaTxnDataSource.name() == "ipcount-kafka-txn"


def test_defaults_and_passthrough() -> None:
    # Spark hands options over lower-cased (CaseInsensitiveDict); both spellings must work.
    opts = {k.lower(): v for k, v in _opts().items()}
    opts.update(
        {
            "kafka.linger.ms": "5",
            "kafka.producer.acks": "all",
            "kafka.consumer.fetch.min.bytes": "1",
        }
    )
    writer = KafkaTxnStreamWriter(opts, COUNTS)
    cfg = writer.config
    assert (cfg.topic, cfg.progress_topic, cfg.query_id) == ("out", "progress", "q1")
    assert cfg.transactional_id == "ipcount-q1"
    assert cfg.transaction_timeout_ms == 60_000 and cfg.retry_deadline_seconds == 60.0
    assert cfg.producer_conf == {
        "bootstrap.servers": "127.0.0.1:9092",
        "linger.ms": "5",
        "acks": "all",
    }
    assert cfg.consumer_conf == {
        "bootstrap.servers": "127.0.0.1:9092",
        "linger.ms": "5",
        "fetch.min.bytes": "1",
    }
    assert writer.mode == "counts" and writer.wire_format == "single-object"


def test_explicit_transactional_id_and_numbers() -> None:
    w = KafkaTxnStreamWriter(
        _opts(transactionalId="tx", transactionTimeoutMs="30000", retryDeadlineSeconds="2.5"),
        COUNTS,
    )
    assert w.config.transactional_id == "tx"
    assert w.config.transaction_timeout_ms == 30_000 and w.config.retry_deadline_seconds == 2.5


@pytest.mark.parametrize(
    ("opts", "message"),
    [
        ({"queryId": ""}, "option 'queryId' is required"),
        ({"topic": " "}, "option 'topic' is required"),
        ({"mode": "avro"}, "option 'mode' must be one of"),
        ({"wireFormat": "json"}, "option 'wireFormat'"),
        ({"wireFormat": "confluent"}, "schemaRegistryUrl"),
        ({"transactionTimeoutMs": "soon"}, "'transactionTimeoutMs' must be a number"),
        ({"transactionTimeoutMs": "10"}, "at least 1000"),
    ],
)
def test_bad_options(opts: dict[str, str], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        KafkaTxnStreamWriter(_opts(**opts), COUNTS)


def test_missing_bootstrap() -> None:
    opts = _opts()
    del opts["kafka.bootstrap.servers"]
    with pytest.raises(ConfigError, match="kafka.bootstrap.servers"):
        KafkaTxnStreamWriter(opts, COUNTS)


def test_schema_check_names_every_problem() -> None:
    bad = StructType(
        [
            StructField("window_start", TimestampType()),
            StructField("ip", StringType()),
            StructField("count", DoubleType()),
            StructField("extra", StringType()),
        ]
    )
    with pytest.raises(SchemaError) as info:
        KafkaTxnStreamWriter(_opts(), bad)
    text = str(info.value)
    assert "missing column window_end" in text
    assert "column count is double, expected bigint or int" in text
    assert "unexpected column extra" in text


def test_raw_mode_takes_key_and_value() -> None:
    assert KafkaTxnStreamWriter(_opts(mode="raw"), RAW).mode == "raw"
    with pytest.raises(SchemaError, match="missing column key"):
        KafkaTxnStreamWriter(_opts(mode="raw"), COUNTS)


def test_sink_options_from_settings_round_trip() -> None:
    settings = load_settings(
        None,
        env={},
        use_default_path=False,
        overrides=[
            "kafka.bootstrap_servers=10.0.0.1:9093",
            "kafka.client.security.protocol=SASL_SSL",
            "kafka.producer.linger.ms=7",
            "kafka.consumer.fetch.max.bytes=1000",
            "sink.transaction_timeout_ms=120000",
        ],
    )
    opts = sink_options(settings, "abc")
    assert opts["topic"] == "ip_count_sink" and opts["progressTopic"] == "ip_count_sink_progress"
    writer = KafkaTxnStreamWriter(opts, COUNTS)
    assert writer.config.transaction_timeout_ms == 120_000
    assert writer.config.producer_conf == {
        "bootstrap.servers": "10.0.0.1:9093",
        "security.protocol": "SASL_SSL",
        # ipcount's default for every client (config.kafka_settings.CLIENT_DEFAULTS) reaches the tasks.
        "reconnect.backoff.ms": "10",
        "linger.ms": "7",
    }
    assert writer.config.consumer_conf["fetch.max.bytes"] == "1000"
    dlq = sink_options(settings, "dlq-query", topic=settings.topics.dead_letter, mode="raw")
    assert KafkaTxnStreamWriter(dlq, RAW).config.topic == "ip_count_dead_letter"
    # The chaos tests' kill points are in the counting query's sink tasks, whose transactions hold
    # the results: not in the driver's (the query's marker only), nor the dead-letter query's.
    assert writer.task_config.fault_points and not writer.config.fault_points
    assert not KafkaTxnStreamWriter(dlq, RAW).task_config.fault_points


def test_producer_config_repr_hides_secrets() -> None:
    from ipcount.sink.producer_config import TxnConfig

    conf = {
        "bootstrap.servers": "b:9093",
        "sasl.password": "hunter2",
        "sasl.oauthbearer.config": "clientId=ipcount clientSecret=s3cr3t",
    }
    cfg = TxnConfig("sink", "progress", "q", "ipcount-q", producer_conf=conf, consumer_conf=conf)
    text = repr(cfg)
    assert "hunter2" not in text and "s3cr3t" not in text
    assert "b:9093" in text and "ipcount-q" in text


def test_the_counts_columns_are_the_avscs_fields() -> None:
    # A field added to ip_count.avsc is a column the sink asks for, with the Spark types that
    # encode to its Avro type.
    from pyspark.sql.types import IntegerType

    from ipcount.formats.avro import RECORD_FIELDS
    from ipcount.sink.writer import _COUNTS_COLUMNS

    assert list(_COUNTS_COLUMNS) == list(RECORD_FIELDS)
    assert _COUNTS_COLUMNS == {
        "window_start": (TimestampType,),
        "window_end": (TimestampType,),
        "ip": (StringType,),
        "count": (LongType, IntegerType),
    }
    writer = KafkaTxnStreamWriter(_opts(), COUNTS)
    assert writer.columns == list(RECORD_FIELDS)
