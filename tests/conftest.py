"""Shared fixtures: a session-wide local broker (or IPCOUNT_TEST_BOOTSTRAP), settings and topic factories.

IPCOUNT_TEST_BROKER picks the local broker kind: kafka (Apache Kafka, KRaft; the default) or
noida-db (the JVM-free stand-in).
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from ipcount.config import Settings, load_settings
from ipcount.local.broker import LocalBroker, free_port
from ipcount.local.kinds import BROKER_KINDS, make_broker

ROOT = Path(__file__).resolve().parent.parent


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    # Directory decides the layer: integration tests need Kafka; e2e tests run Spark too.
    for item in items:
        if "spark" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.spark)
        path = str(item.fspath)
        if f"{os.sep}integration{os.sep}" in path:
            item.add_marker(pytest.mark.kafka)
        elif f"{os.sep}e2e{os.sep}" in path:
            item.add_marker(pytest.mark.kafka)
            item.add_marker(pytest.mark.e2e)
            item.add_marker(pytest.mark.slow)


def _has_ipv6() -> bool:
    try:
        with socket.socket(socket.AF_INET6) as s:
            s.bind(("::1", 0))
    except OSError:
        return False
    return True


@pytest.fixture(scope="session")
def ipv6_loopback() -> bool:
    """Whether this machine has an IPv6 loopback ([::1]) to bind to."""
    return _has_ipv6()


def pytest_runtest_setup(item: pytest.Item) -> None:
    if item.get_closest_marker("ipv6") is not None and not _has_ipv6():
        pytest.skip("no IPv6 loopback on this machine")


@pytest.fixture(scope="session", autouse=True)
def _python_for_spark_workers() -> None:
    # Spark's Python workers must run this interpreter (with ipcount installed), not system python3.
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)


def _broker_kind() -> str:
    kind = os.environ.get("IPCOUNT_TEST_BROKER", "kafka")
    if kind not in BROKER_KINDS:
        raise pytest.UsageError(
            f"IPCOUNT_TEST_BROKER={kind!r}: use one of {', '.join(BROKER_KINDS)}"
        )
    return kind


@pytest.fixture(scope="session")
def broker_kind() -> str:
    """The local broker kind tests start: env IPCOUNT_TEST_BROKER (kafka or noida-db)."""
    return _broker_kind()


@pytest.fixture(scope="session")
def new_broker() -> Callable[..., LocalBroker]:
    """A factory: a local broker of the tests' kind in a data dir, on a free port, not started
    (keyword arguments go to `make_broker`, e.g. transaction_max_timeout_ms)."""

    def _new(data_dir: Path, **kwargs: int) -> LocalBroker:
        return make_broker(_broker_kind(), data_dir, "127.0.0.1", free_port(), **kwargs)

    return _new


@pytest.fixture(scope="session")
def bootstrap(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """Bootstrap servers of the test broker: IPCOUNT_TEST_BOOTSTRAP, else a local broker of kind
    IPCOUNT_TEST_BROKER started here."""
    external = os.environ.get("IPCOUNT_TEST_BOOTSTRAP")
    if external:
        yield external
        return
    broker = make_broker(
        _broker_kind(), tmp_path_factory.mktemp("broker"), "127.0.0.1", free_port()
    )
    broker.start(timeout=60)
    try:
        yield broker.bootstrap
    finally:
        broker.stop()


def unique(prefix: str) -> str:
    """A topic/group/id name no other test uses."""
    return f"{prefix}-{uuid.uuid4().hex[:10]}"


@pytest.fixture
def make_settings(bootstrap: str, tmp_path: Path) -> Callable[..., Settings]:
    """Settings pointed at the test broker, with fresh topic names and a tmp checkpoint.

    Extra 'section.key=value' overrides may be passed.
    """

    def _make(*overrides: str) -> Settings:
        tag = uuid.uuid4().hex[:8]
        base = [
            f"kafka.bootstrap_servers={bootstrap}",
            f"topics.source=src-{tag}",
            f"topics.sink=sink-{tag}",
            f"topics.progress=progress-{tag}",
            f"topics.late=late-{tag}",
            f"topics.dead_letter=dlq-{tag}",
            f"job.checkpoint_location={tmp_path / ('ckpt-' + tag)}",
            f"broker.data_dir={tmp_path / 'unused-broker'}",
        ]
        return load_settings(ROOT / "conf" / "ipcount.toml", env={}, overrides=[*base, *overrides])

    return _make


@pytest.fixture
def settings(make_settings: Callable[..., Settings]) -> Settings:
    """Settings for one test with its own topics (not yet created)."""
    return make_settings()


@pytest.fixture(scope="session")
def spark(tmp_path_factory: pytest.TempPathFactory) -> Iterator[object]:
    """One local[2] SparkSession for the test session, with ipcount's data sources registered."""
    from ipcount.job.session import build_session

    settings = load_settings(
        ROOT / "conf" / "ipcount.toml", env={}, overrides=["spark.master=local[2]"]
    )
    session = build_session(
        settings,
        {
            "spark.sql.shuffle.partitions": "2",
            "spark.sql.warehouse.dir": str(tmp_path_factory.mktemp("warehouse")),
        },
    )
    try:
        yield session
    finally:
        session.stop()


def cli_env(settings: Settings, env: dict[str, str] | None = None) -> dict[str, str]:
    """The environment that points an `ipcount` process at the test's broker, topics and
    checkpoint, on local[2]; `env` adds more IPCOUNT_* settings."""
    return {
        **os.environ,
        "PYSPARK_PYTHON": sys.executable,
        "IPCOUNT_KAFKA_BOOTSTRAP_SERVERS": settings.kafka.bootstrap_servers,
        "IPCOUNT_TOPICS_SOURCE": settings.topics.source,
        "IPCOUNT_TOPICS_SINK": settings.topics.sink,
        "IPCOUNT_TOPICS_PROGRESS": settings.topics.progress,
        "IPCOUNT_TOPICS_LATE": settings.topics.late,
        "IPCOUNT_TOPICS_DEAD_LETTER": settings.topics.dead_letter,
        "IPCOUNT_JOB_CHECKPOINT_LOCATION": settings.job.checkpoint_location,
        "IPCOUNT_SPARK_MASTER": "local[2]",
        **(env or {}),
    }


def run_ipcount(
    settings: Settings,
    *args: str,
    timeout: float = 300,
    env: dict[str, str] | None = None,
    own_group: bool = False,
) -> subprocess.CompletedProcess[str]:
    """Run the `ipcount` CLI as a user would, pointed (by env) at the test's broker, topics and
    checkpoint, on local[2]; `env` adds more IPCOUNT_* settings. `own_group`: in a process group
    of its own, which an injected fault (IPCOUNT_FAULTS) kills without the test."""
    return subprocess.run(
        [sys.executable, "-m", "ipcount", *args],
        env=cli_env(settings, env),
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=timeout,
        start_new_session=own_group,
    )


@pytest.fixture
def ipcount_env() -> Callable[..., dict[str, str]]:
    """`cli_env`: the environment of an `ipcount` process against this test's settings."""
    return cli_env


@pytest.fixture
def ipcount_cli() -> Callable[..., subprocess.CompletedProcess[str]]:
    """`run_ipcount`: the CLI against this test's settings."""
    return run_ipcount
