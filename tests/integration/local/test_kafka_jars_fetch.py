"""The first Apache Kafka start on a machine with Java but no Maven: the jars come from Maven Central
through the Ivy inside PySpark, once, and a broker runs on them; without a network the error says
Maven Central could not be reached. These tests fetch for real (~45 s, 43 MB)."""

from __future__ import annotations

import logging
import os
import shutil
from pathlib import Path

import pytest
from confluent_kafka.admin import AdminClient

from ipcount.errors import BrokerError
from ipcount.local.broker import free_port
from ipcount.local.kafka_jars import KAFKA_VERSION, kafka_classpath
from ipcount.local.kraft import KafkaBroker

JAVA = shutil.which("java")
if JAVA is None and not os.environ.get("JAVA_HOME") and not os.environ.get("CI"):
    pytest.skip("Apache Kafka tests need Java 17+ (not on this machine)", allow_module_level=True)

pytestmark = pytest.mark.slow


@pytest.fixture
def no_maven(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    """An empty cache and a PATH that has java but no mvn; returns the Kafka cache home."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    if JAVA is not None:
        (bin_dir / "java").symlink_to(JAVA)
    monkeypatch.setenv("PATH", str(bin_dir))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    for name in ("IPCOUNT_KAFKA_JARS", "IPCOUNT_KAFKA_RESOLVER", "JAVA_TOOL_OPTIONS"):
        monkeypatch.delenv(name, raising=False)
    return tmp_path / "cache" / "ipcount" / f"kafka-{KAFKA_VERSION}"


def test_first_start_without_maven_fetches_the_jars_once_and_the_broker_serves(
    no_maven: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    # What a killed earlier fetch left behind must not end up on the class path.
    dead = no_maven / "libs.partial-killed"
    dead.mkdir(parents=True)
    (dead / "half.jar").write_bytes(b"PK")
    caplog.set_level(logging.INFO, logger="ipcount.local.kafka_jars")

    classpath = kafka_classpath()

    libs = no_maven / "libs"
    assert classpath == str(libs / "*")
    lines = [r.getMessage() for r in caplog.records]
    assert any(
        line.startswith(f"fetching Apache Kafka {KAFKA_VERSION} jars from Maven Central with ")
        and "Ivy" in line
        and f"(once, into {libs})" in line
        for line in lines
    ), lines
    jars = sorted(p.name for p in libs.iterdir())
    assert f"kafka_2.13-{KAFKA_VERSION}.jar" in jars
    assert f"kafka-clients-{KAFKA_VERSION}.jar" in jars
    assert any(j.startswith("log4j-slf4j-impl-") for j in jars)
    assert all(j.endswith(".jar") for j in jars), jars
    assert not [j for j in jars if j.endswith(("-sources.jar", "-javadoc.jar", "-tests.jar"))]
    # Nothing but the jars is kept: no staging dir, no resolver cache.
    assert not list(no_maven.glob("libs.partial*"))
    assert not (no_maven / "ivy-cache").exists()

    caplog.clear()
    assert kafka_classpath() == classpath
    assert not [r for r in caplog.records if "fetching" in r.getMessage()]

    broker = KafkaBroker(tmp_path / "kraft", "127.0.0.1", free_port())
    broker.start(timeout=90)
    try:
        admin = AdminClient({"bootstrap.servers": broker.bootstrap})
        metadata = admin.list_topics(timeout=20)
        assert len(metadata.brokers) == 1
    finally:
        broker.stop()


def test_without_network_the_error_names_maven_central(
    no_maven: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # No route to Maven Central: every HTTP(S) request goes to a proxy port where nothing listens.
    closed = free_port()
    monkeypatch.setenv(
        "JAVA_TOOL_OPTIONS",
        f"-Dhttps.proxyHost=127.0.0.1 -Dhttps.proxyPort={closed} "
        f"-Dhttp.proxyHost=127.0.0.1 -Dhttp.proxyPort={closed}",
    )
    monkeypatch.setenv("IPCOUNT_KAFKA_RESOLVER", "ivy")
    with pytest.raises(BrokerError) as err:
        kafka_classpath()
    message = str(err.value)
    assert "could not reach Maven Central" in message
    assert "Connection refused" in message
    assert "IPCOUNT_KAFKA_JARS" in message
    assert not (no_maven / "libs").exists()
    assert not list(no_maven.glob("libs.partial*"))
