"""Which local broker to run: `broker.kind` ("kafka", Apache Kafka, the default; or "noida-db",
the JVM-free stand-in)."""

from __future__ import annotations

from pathlib import Path

from ipcount.config import Settings
from ipcount.errors import ConfigError
from ipcount.local.broker import LocalBroker
from ipcount.local.kafka_jars import KAFKA_VERSION
from ipcount.local.kraft import KafkaBroker
from ipcount.local.noida import NoidaBroker

__all__ = ["BROKER_KINDS", "make_broker", "configured_broker"]

BROKER_KINDS = ("kafka", "noida-db")


def make_broker(
    kind: str,
    data_dir: str | Path,
    host: str = "127.0.0.1",
    port: int = 9092,
    *,
    transaction_max_timeout_ms: int = 900_000,
    kafka_version: str | None = None,
) -> LocalBroker:
    """A local broker of `kind` (not started).

    Raises:
        ConfigError: an unknown kind.
    """
    if kind == "noida-db":
        return NoidaBroker(data_dir, host, port)
    if kind == "kafka":
        return KafkaBroker(
            data_dir,
            host,
            port,
            version=kafka_version or KAFKA_VERSION,
            transaction_max_timeout_ms=transaction_max_timeout_ms,
        )
    raise ConfigError(
        f"broker.kind = {kind!r} is not a local broker kind; use one of {', '.join(BROKER_KINDS)} "
        "(env IPCOUNT_BROKER_KIND)"
    )


def configured_broker(
    settings: Settings, data_dir: str | Path | None = None, port: int | None = None
) -> LocalBroker:
    """The [broker] of `settings`; `data_dir` and `port` replace the configured ones (a run's own
    broker on a free port)."""
    b = settings.broker
    return make_broker(
        b.kind,
        b.data_dir if data_dir is None else data_dir,
        b.host,
        b.port if port is None else port,
        transaction_max_timeout_ms=b.transaction_max_timeout_ms,
        kafka_version=b.kafka_version or None,
    )
