"""Settings: file, env and CLI overrides, validation messages."""

from __future__ import annotations

import dataclasses
import tomllib
from pathlib import Path

import pytest

from ipcount.config import Settings, load_settings, redact
from ipcount.errors import ConfigError

ROOT = Path(__file__).resolve().parents[2]
CONF = ROOT / "conf" / "ipcount.toml"


def test_shipped_config_loads_and_matches_defaults() -> None:
    from_file = load_settings(CONF, env={})
    defaults = load_settings(None, env={}, use_default_path=False)
    # conf/ipcount.toml documents the defaults; only the passthrough tables may add settings.
    for section in ("topics", "job", "sink", "broker"):
        assert getattr(from_file, section) == getattr(defaults, section), section
    assert from_file.kafka.bootstrap_servers == defaults.kafka.bootstrap_servers
    assert from_file.spark.shuffle_partitions == defaults.spark.shuffle_partitions


# Settings still accepted, with no effect, so existing config files load; not documented.
RETIRED = {("job", "max_record_bytes")}


def test_shipped_config_lists_every_setting() -> None:
    data = tomllib.loads(CONF.read_text())
    for section in ("kafka", "topics", "job", "sink", "broker", "spark"):
        cls = type(getattr(Settings(), section))
        for f in dataclasses.fields(cls):
            if (section, f.name) in RETIRED:
                assert f.name not in data[section], f"{section}.{f.name} is retired"
                continue
            assert f.name in data[section], (
                f"{section}.{f.name} is not documented in conf/ipcount.toml"
            )


def test_env_overrides_both_spellings_and_passthrough() -> None:
    s = load_settings(
        CONF,
        env={
            "IPCOUNT_KAFKA_BOOTSTRAP_SERVERS": "k1:9093,k2:9093",
            "IPCOUNT_JOB__WINDOW_SECONDS": "10",
            "IPCOUNT_JOB_DEAD_LETTER": "true",
            "IPCOUNT_KAFKA_CLIENT__SASL_PASSWORD": "hunter2",
            "IPCOUNT_KAFKA_CLIENT__SECURITY_PROTOCOL": "SASL_SSL",
            "UNRELATED": "x",
        },
    )
    assert s.kafka.bootstrap_servers == "k1:9093,k2:9093"
    assert s.job.window_seconds == 10.0
    assert s.job.dead_letter is True
    conf = s.kafka.to_librdkafka("consumer")
    assert conf["sasl.password"] == "hunter2"
    assert conf["security.protocol"] == "SASL_SSL"
    assert "receive.message.max.bytes" not in conf  # a noida-db workaround, not a setting
    assert "hunter2" not in repr(s)


def test_cli_overrides_win_over_env() -> None:
    s = load_settings(
        CONF,
        env={"IPCOUNT_JOB_WINDOW_SECONDS": "10"},
        overrides=[
            "job.window_seconds=20",
            "kafka.producer.linger.ms=5",
            "spark.conf.spark.foo=bar",
        ],
    )
    assert s.job.window_seconds == 20.0
    assert s.kafka.to_librdkafka("producer")["linger.ms"] == "5"
    assert s.spark.conf["spark.foo"] == "bar"


def test_role_tables_do_not_leak_between_roles() -> None:
    s = load_settings(CONF, env={}, overrides=["kafka.producer.acks=all"])
    assert "acks" not in s.kafka.to_librdkafka("consumer")
    assert "receive.message.max.bytes" not in s.kafka.to_librdkafka("producer")


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
    ],
)
def test_bad_settings_give_one_clear_message(
    env: dict[str, str], overrides: list[str], message: str
) -> None:
    with pytest.raises(ConfigError) as info:
        load_settings(CONF, env=env, overrides=overrides)
    assert message in str(info.value)


def test_bad_file(tmp_path: Path) -> None:
    bad = tmp_path / "bad.toml"
    bad.write_text("[job]\nwindow_seconds = \n")
    with pytest.raises(ConfigError, match="not valid TOML"):
        load_settings(bad, env={})
    wrong_type = tmp_path / "type.toml"
    wrong_type.write_text('[job]\nwindow_seconds = "five"\n')
    with pytest.raises(
        ConfigError, match=r"type.toml \[job\]: job.window_seconds must be a number"
    ):
        load_settings(wrong_type, env={})
    unknown = tmp_path / "unknown.toml"
    unknown.write_text("[jobs]\n")
    with pytest.raises(ConfigError, match=r"unknown section \[jobs\].*did you mean job"):
        load_settings(unknown, env={})
    with pytest.raises(ConfigError, match="does not exist"):
        load_settings(tmp_path / "missing.toml", env={})


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


def test_a_config_that_still_sets_max_record_bytes_loads() -> None:
    # Retired (a record's length never decides whether it counts): old files keep working.
    s = load_settings(CONF, env={}, overrides=["job.max_record_bytes=100"])
    assert s.job.dead_letter is True
