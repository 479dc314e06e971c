"""The local broker and topic provisioning, against real broker processes (the kind
IPCOUNT_TEST_BROKER names) and the CLI."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from confluent_kafka.admin import AdminClient, ConfigResource, ResourceType

from ipcount.config import Settings
from ipcount.errors import BrokerError
from ipcount.kafka.topics import ensure_topics, missing_topics
from ipcount.local.broker import free_port
from ipcount.local.kinds import make_broker

ROOT = Path(__file__).resolve().parents[3]


def _cli(*args: str, env: dict[str, str], timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "ipcount", *args],
        capture_output=True,
        text=True,
        env={**os.environ, **env},
        cwd=ROOT,
        timeout=timeout,
    )


def test_cli_broker_lifecycle_and_topics(tmp_path: Path, broker_kind: str) -> None:
    port = free_port()
    env = {
        "IPCOUNT_BROKER_KIND": broker_kind,
        "IPCOUNT_BROKER_PORT": str(port),
        "IPCOUNT_BROKER_DATA_DIR": str(tmp_path / "data"),
        "IPCOUNT_KAFKA_BOOTSTRAP_SERVERS": f"127.0.0.1:{port}",
    }
    started = _cli("broker", "start", env=env)
    try:
        assert started.returncode == 0, started.stderr
        assert f"bootstrap 127.0.0.1:{port}" in started.stdout
        again = _cli("broker", "start", env=env)
        assert again.returncode == 1
        assert "already running" in again.stderr
        status = _cli("broker", "status", env=env)
        assert status.returncode == 0 and "running: pid" in status.stdout
        created = _cli("topics", "create", env=env)
        assert created.returncode == 0, created.stderr
        assert "ip_count_source: created" in created.stdout
        assert "ip_count_sink_progress: created" in created.stdout
        repeat = _cli("topics", "create", env=env)
        assert repeat.returncode == 0
        assert "ip_count_source: exists" in repeat.stdout
        listed = _cli("topics", "list", env=env)
        assert listed.returncode == 0 and "missing" not in listed.stdout
    finally:
        stopped = _cli("broker", "stop", env=env)
    assert stopped.returncode == 0 and "broker stopped" in stopped.stdout
    after = _cli("broker", "status", env=env)
    assert after.returncode == 3 and "not running" in after.stdout


def test_topics_create_against_dead_port_fails_fast() -> None:
    dead = free_port()
    t0 = time.monotonic()
    res = _cli(
        "--set",
        f"kafka.bootstrap_servers=127.0.0.1:{dead}",
        "--set",
        "kafka.connect_timeout_seconds=3",
        "topics",
        "create",
        env={},
    )
    elapsed = time.monotonic() - t0
    assert res.returncode == 1
    assert f"no Kafka broker answered at 127.0.0.1:{dead}" in res.stderr
    assert "Traceback" not in res.stderr
    assert elapsed < 15, elapsed


def test_cli_config_error_is_one_line() -> None:
    res = _cli("--set", "job.window_seconds=-1", "topics", "list", env={})
    assert res.returncode == 1
    assert (
        res.stderr.strip()
        == "ipcount topics: error: override job.window_seconds: job.window_seconds must be positive, got -1.0"
    )


def test_ensure_topics_settings_and_idempotence(settings: Settings) -> None:
    assert set(missing_topics(settings)) == {
        settings.topics.source,
        settings.topics.sink,
        settings.topics.progress,
        settings.topics.late,
        settings.topics.dead_letter,
    }
    first = ensure_topics(settings)
    assert set(first.values()) == {"created"}
    assert set(ensure_topics(settings).values()) == {"exists"}
    assert missing_topics(settings) == []
    admin = AdminClient({"bootstrap.servers": settings.kafka.bootstrap_servers})
    md = admin.list_topics(timeout=5)
    assert len(md.topics[settings.topics.source].partitions) == settings.topics.source_partitions
    futures = admin.describe_configs(
        [
            ConfigResource(ResourceType.TOPIC, settings.topics.source),
            ConfigResource(ResourceType.TOPIC, settings.topics.progress),
        ]
    )
    configs = {res.name: fut.result() for res, fut in futures.items()}
    assert configs[settings.topics.source]["retention.ms"].value == "-1"
    assert configs[settings.topics.progress]["cleanup.policy"].value == "compact"
    # Rolled and compacted within the hour: a start reads the whole topic (issue #37's soak).
    assert configs[settings.topics.progress]["segment.ms"].value == "3600000"


def test_broker_survives_restart_with_data(tmp_path: Path, make_settings, new_broker) -> None:  # type: ignore[no-untyped-def]
    broker = new_broker(tmp_path / "b")
    broker.start()
    try:
        with pytest.raises(BrokerError, match="already running"):
            broker.start()
        s = make_settings(f"kafka.bootstrap_servers={broker.bootstrap}")
        ensure_topics(s)
        pid = broker.status().pid
        assert pid is not None
        if not broker.durable_kill:
            # noida-db saves its state about once a second: a kill -9 sooner loses the last writes.
            time.sleep(2.0)
        broker.kill()
        assert not broker.status().running
        broker.start()
        assert missing_topics(s) == []
    finally:
        broker.stop()
    assert not broker.stop()


def test_port_in_use_is_reported(tmp_path: Path, bootstrap: str, broker_kind: str) -> None:
    host, port = bootstrap.rsplit(":", 1)
    if os.environ.get("IPCOUNT_TEST_BOOTSTRAP"):
        pytest.skip("external broker")
    with pytest.raises(BrokerError, match="is in use"):
        make_broker(broker_kind, tmp_path / "c", host, int(port)).start()
