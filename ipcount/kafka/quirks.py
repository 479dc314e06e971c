"""Where noida-db, the embedded development broker, differs from Apache Kafka, and the switches
for the workarounds ipcount carries for it: on Apache Kafka none of them is active."""

from __future__ import annotations

import logging
import threading
from collections.abc import Mapping
from dataclasses import dataclass

from ipcount.errors import ConfigError

__all__ = [
    "BrokerQuirks",
    "NOIDA_DB",
    "NONE",
    "QUIRK_MODES",
    "broker_quirks",
    "quirks_named",
]

logger = logging.getLogger(__name__)

QUIRK_MODES = ("auto", "noida-db", "none")


@dataclass(frozen=True)
class BrokerQuirks:
    """The client-side workarounds a broker needs."""

    name: str
    # noida-db answers an empty fetch at once instead of waiting fetch.wait.max.ms, so an idle
    # assigned consumer spins (~0.5 core client plus ~0.4 core broker): idle readers release
    # their partitions and look again after a back-off. Apache Kafka holds the fetch open.
    spins_on_empty_fetch: bool = False
    # noida-db ignores fetch size limits (fetch.max.bytes, max.partition.fetch.bytes): one fetch
    # can carry a partition's whole backlog, so the source raises receive.message.max.bytes.
    # Apache Kafka honours the limits.
    ignores_fetch_limits: bool = False
    # noida-db: a read_committed fetch that starts after an aborted transaction of a producer
    # hides that producer's later committed records, so a history is read from its start there.
    # Apache Kafka returns them from any offset.
    hides_commits_read_mid_log: bool = False

    def consumer_defaults(self) -> dict[str, str]:
        """librdkafka consumer settings these quirks need (settings given by the user win)."""
        if self.ignores_fetch_limits:
            return {"receive.message.max.bytes": "1000000000"}
        return {}


NOIDA_DB = BrokerQuirks(
    "noida-db",
    spins_on_empty_fetch=True,
    ignores_fetch_limits=True,
    hides_commits_read_mid_log=True,
)
NONE = BrokerQuirks("none")

_detected: dict[str, BrokerQuirks] = {}
_lock = threading.Lock()


def quirks_named(mode: str) -> BrokerQuirks:
    """NOIDA_DB or NONE by name ("auto" is not a name: see `broker_quirks`).

    Raises:
        ConfigError: an unknown name.
    """
    if mode == "noida-db":
        return NOIDA_DB
    if mode == "none":
        return NONE
    raise ConfigError(f"kafka.broker_quirks = {mode!r}: use one of {', '.join(QUIRK_MODES)}")


def broker_quirks(
    conf: Mapping[str, str], mode: str = "auto", timeout: float = 10.0
) -> BrokerQuirks:
    """The quirks of the brokers `conf` points at, as `kafka.broker_quirks` (`mode`) picks them:
    "auto" (default) asks the broker once per process and bootstrap list; "noida-db" or "none"
    say it outright (e.g. when DescribeConfigs is not allowed). Durability differences (noida-db
    saves its state about once a second) are not client workarounds: they are
    `LocalBroker.durable_kill`, used by the tests and `ipcount chaos`.

    "auto" asks the broker for its configuration (DescribeConfigs) once per bootstrap list:
    Apache Kafka reports hundreds of settings including transaction.max.timeout.ms; noida-db
    answers with a handful and never that one. A broker that cannot be asked (not allowed,
    unreachable) is taken to be Apache Kafka: no workaround.
    """
    if mode != "auto":
        return quirks_named(mode)
    key = str(conf.get("bootstrap.servers", ""))
    with _lock:
        if key in _detected:
            return _detected[key]
    found = _detect(conf, timeout)
    with _lock:
        _detected[key] = found
    logger.debug("broker quirks for %s: %s", key, found.name)
    return found


def _detect(conf: Mapping[str, str], timeout: float) -> BrokerQuirks:
    # The Kafka client is imported here, on the driver only: the source's options (and so this
    # module) are also loaded where Spark creates the data source (source.data_source).
    from confluent_kafka import KafkaException
    from confluent_kafka.admin import ConfigResource, ResourceType

    from ipcount.kafka.client import admin_client, describe_kafka_error

    admin = admin_client(conf)
    try:
        md = admin.list_topics(timeout=timeout)
        broker_id = str(md.controller_id if md.controller_id >= 0 else next(iter(md.brokers)))
        futures = admin.describe_configs([ConfigResource(ResourceType.BROKER, broker_id)])
        entries = next(iter(futures.values())).result(timeout=timeout)
    except (KafkaException, StopIteration, ValueError) as exc:
        logger.debug("cannot ask the broker for its configuration: %s", describe_kafka_error(exc))
        return NONE
    if "transaction.max.timeout.ms" not in entries and len(entries) < 20:
        return NOIDA_DB
    return NONE
