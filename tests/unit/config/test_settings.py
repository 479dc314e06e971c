"""The settings themselves: validation messages, per-role client settings, secrets, replace."""

from __future__ import annotations

from pathlib import Path

import pytest

from ipcount.config import load_settings, redact
from ipcount.errors import ConfigError

ROOT = Path(__file__).resolve().parents[3]
CONF = ROOT / "conf" / "ipcount.toml"


def test_role_tables_do_not_leak_between_roles() -> None:
    s = load_settings(CONF, env={}, overrides=["kafka.producer.acks=all"])
    assert "acks" not in s.kafka.to_librdkafka("consumer")
    assert "receive.message.max.bytes" not in s.kafka.to_librdkafka("producer")


def test_every_client_gets_a_short_reconnect_backoff_unless_the_user_sets_one() -> None:
    """librdkafka's 100 ms default holds a new client's first request ~50 ms (the sink opens
    clients per task): ipcount's 10 ms is the default for every role, and kafka.* still wins."""
    s = load_settings(CONF, env={})
    for role in ("client", "consumer", "producer", "admin"):
        assert s.kafka.to_librdkafka(role)["reconnect.backoff.ms"] == "10"
    mine = load_settings(CONF, env={}, overrides=["kafka.client.reconnect.backoff.ms=250"])
    assert mine.kafka.to_librdkafka("producer")["reconnect.backoff.ms"] == "250"
    theirs = load_settings(CONF, env={}, overrides=["kafka.consumer.reconnect.backoff.ms=50"])
    assert theirs.kafka.to_librdkafka("consumer")["reconnect.backoff.ms"] == "50"
    assert theirs.kafka.to_librdkafka("producer")["reconnect.backoff.ms"] == "10"


@pytest.mark.parametrize(
    ("env", "overrides", "message"),
    [
        (
            {},
            ["job.windw_seconds=3"],
            "unknown setting job.windw_seconds (did you mean job.window_seconds?)",
        ),
        ({}, ["job.window_seconds=abc"], "job.window_seconds must be a number, got 'abc'"),
        (
            {"IPCOUNT_JOB_WINDOW_SECONDS": "-5"},
            [],
            "env IPCOUNT_JOB_WINDOW_SECONDS: job.window_seconds must be positive",
        ),
        ({}, ["topics.source_partitions=0"], "topics.source_partitions must be at least 1"),
        ({}, ["kafka.bootstrap_servers=nohostport"], "kafka.bootstrap_servers must be host:port"),
        ({}, ["sink.wire_format=json"], "sink.wire_format must be 'single-object' or 'confluent'"),
        ({}, ["sink.wire_format=confluent"], "sink.schema_registry_url must be set"),
        (
            {},
            ["sink.transaction_timeout_ms=10"],
            "sink.transaction_timeout_ms must be at least 1000",
        ),
        (
            {},
            ["job.max_records_per_partition=-1"],
            "job.max_records_per_partition must be 0 (no limit) or positive",
        ),
        ({}, ["spark.state_store=memory"], "spark.state_store must be 'rocksdb' or 'hdfs'"),
        (
            {},
            ["job.starting_offsets=first"],
            "job.starting_offsets must be 'earliest', 'latest' or a JSON",
        ),
        ({}, ["topics.sink=ip_count_source"], "must all differ"),
        ({}, ["topics.sink=bad name"], "must be a valid Kafka topic name"),
        ({}, ["nosection=1"], "must start with a section"),
        ({}, ["job.dead_letter=maybe"], "job.dead_letter must be true or false"),
        ({"IPCOUNT_NOPE_X": "1"}, [], "env IPCOUNT_NOPE_X does not name a section"),
        ({}, ["metrics.port=70000"], "metrics.port must be 0 (off) or a TCP port (1-65535)"),
        ({"IPCOUNT_METRICS_PORT": "-1"}, [], "env IPCOUNT_METRICS_PORT: metrics.port must be 0"),
        ({}, ["metrics.host="], "metrics.host must name an address to listen on"),
        ({}, ["metrics.stall_triggers=0"], "metrics.stall_triggers must be at least 1"),
        ({}, ["metrics.lag_poll_seconds=0"], "metrics.lag_poll_seconds must be positive"),
        ({}, ["job.restart_window_seconds=-1"], "job.restart_window_seconds must be 0"),
        (
            {},
            ["job.restart_window_seconds=25"],  # 3 restarts 10 s apart never fill 25 s
            "job.restart_window_seconds must be 0 (the job's life) or over attempts x delay (30s)",
        ),
    ],
)
def test_bad_settings_give_one_clear_message(
    env: dict[str, str], overrides: list[str], message: str
) -> None:
    with pytest.raises(ConfigError) as info:
        load_settings(CONF, env=env, overrides=overrides)
    assert message in str(info.value)


def test_redact_hides_secrets() -> None:
    out = redact({"sasl.password": "x", "ssl.key.password": "y", "bootstrap.servers": "b"})
    assert out == {"sasl.password": "***", "ssl.key.password": "***", "bootstrap.servers": "b"}


def test_replace_revalidates() -> None:
    s = load_settings(CONF, env={})
    assert s.replace("job", window_seconds=10).job.window_seconds == 10
    with pytest.raises(ConfigError):
        s.replace("job", window_seconds=-1)


def test_dead_letters_are_on_and_keep_the_longest_line_nginx_writes_whole() -> None:
    s = load_settings(CONF, env={})
    assert s.job.dead_letter is True
    # Default buffers: 1 KiB + 4 x 8 KiB of client bytes in the line, each at most 4 bytes (\xHH).
    nginx_longest = (1024 + 4 * 8192) * 4 + 200
    assert nginx_longest < s.job.dead_letter_max_bytes < 1_000_000  # below Kafka's record limit
