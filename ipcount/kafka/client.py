"""Kafka client helpers shared by the driver and executors: connectivity, broker settings, error
text."""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping
from typing import Any

from confluent_kafka import KafkaError, KafkaException
from confluent_kafka.admin import AdminClient, ClusterMetadata, ConfigResource, ResourceType

from ipcount.errors import BrokerError, ConfigError

__all__ = [
    "admin_client",
    "wait_for_metadata",
    "broker_max_transaction_timeout_ms",
    "check_transaction_timeout",
    "describe_kafka_error",
    "error_cb_logger",
    "with_client_logging",
    "transaction_timeout_error",
]

logger = logging.getLogger(__name__)

# librdkafka reports these through error_cb while it keeps retrying on its own.
_TRANSIENT_CODES = {
    KafkaError._TRANSPORT,
    KafkaError._ALL_BROKERS_DOWN,
    KafkaError._RESOLVE,
    KafkaError._TIMED_OUT,
}


def describe_kafka_error(err: Any) -> str:
    """Render a KafkaError (or anything) as 'NAME (code N): text'."""
    if isinstance(err, KafkaException) and err.args:
        err = err.args[0]
    if isinstance(err, KafkaError):
        return f"{err.name()} (code {err.code()}): {err.str()}"
    return str(err)


def error_cb_logger(name: str) -> Any:
    """An `error_cb` for librdkafka clients that logs at a level chosen by error code."""
    log = logging.getLogger(name)

    def _cb(err: KafkaError) -> None:
        if err.fatal():
            log.error("fatal Kafka error: %s", describe_kafka_error(err))
        elif err.code() in _TRANSIENT_CODES:
            log.debug("transient Kafka error (client retries): %s", describe_kafka_error(err))
        else:
            log.warning("Kafka error: %s", describe_kafka_error(err))

    return _cb


class _DebugLogger:
    """librdkafka's log lines go to Python logging at DEBUG; errors surface through error_cb."""

    def __init__(self, name: str) -> None:
        self._log = logging.getLogger(name)

    def log(self, level: int, msg: str, *args: Any) -> None:
        self._log.debug(msg, *args)


def with_client_logging(
    conf: Mapping[str, Any], name: str = "ipcount.librdkafka"
) -> dict[str, Any]:
    """Copy a client config, adding an error_cb and a logger: librdkafka never writes to stderr."""
    full: dict[str, Any] = {"error_cb": error_cb_logger(name), "logger": _DebugLogger(name)}
    full.update(conf)
    return full


def admin_client(conf: Mapping[str, str]) -> AdminClient:
    """An AdminClient whose connection noise goes to Python logging, not stderr."""
    return AdminClient(with_client_logging(conf))


def wait_for_metadata(conf: Mapping[str, str], timeout: float) -> ClusterMetadata:
    """Return cluster metadata, or raise BrokerError if no broker answers within `timeout` seconds.

    Raises:
        BrokerError: naming the bootstrap servers and the setting that points at them.
    """
    admin = admin_client(conf)
    deadline = time.monotonic() + timeout
    last: Exception | None = None
    while True:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            break
        try:
            md = admin.list_topics(timeout=min(remaining, 2.0))
            if md.brokers:
                return md
        except KafkaException as exc:
            last = exc
        time.sleep(0.1)
    detail = f": {describe_kafka_error(last)}" if last else ""
    raise BrokerError(
        f"no Kafka broker answered at {conf.get('bootstrap.servers')} within {timeout:g}s{detail}. "
        "Start one (`ipcount broker start`) or point kafka.bootstrap_servers "
        "(env IPCOUNT_KAFKA_BOOTSTRAP_SERVERS) at a running cluster."
    )


def broker_max_transaction_timeout_ms(conf: Mapping[str, str], timeout: float = 10.0) -> int | None:
    """The broker's transaction.max.timeout.ms from DescribeConfigs, or None if it does not say."""
    admin = admin_client(conf)
    md = wait_for_metadata(conf, timeout)
    broker_id = str(md.controller_id if md.controller_id >= 0 else next(iter(md.brokers)))
    try:
        futures = admin.describe_configs([ConfigResource(ResourceType.BROKER, broker_id)])
        for fut in futures.values():
            entries = fut.result(timeout=timeout)
            entry = entries.get("transaction.max.timeout.ms")
            if entry is not None and entry.value not in (None, ""):
                return int(entry.value)
    except (KafkaException, ValueError) as exc:
        logger.debug(
            "DescribeConfigs on broker %s failed: %s", broker_id, describe_kafka_error(exc)
        )
    return None


def check_transaction_timeout(
    producer_conf: Mapping[str, str], timeout_ms: int, timeout: float = 10.0
) -> None:
    """Fail fast if `timeout_ms` exceeds the broker's transaction.max.timeout.ms.

    The broker's value is read with DescribeConfigs. Brokers that do not report it (noida-db) are
    checked by the transactional producer itself: `init_transactions` then fails with
    INVALID_TRANSACTION_TIMEOUT, which the sink turns into the same message.

    Raises:
        ConfigError: naming sink.transaction_timeout_ms and transaction.max.timeout.ms.
    """
    maximum = broker_max_transaction_timeout_ms(producer_conf, timeout)
    if maximum is not None and timeout_ms > maximum:
        raise transaction_timeout_error(timeout_ms, maximum)


def transaction_timeout_error(timeout_ms: int, maximum: int | None) -> ConfigError:
    """The one message for a transaction timeout the broker will not accept."""
    limit = f"{maximum} ms" if maximum is not None else "its maximum"
    return ConfigError(
        f"sink.transaction_timeout_ms = {timeout_ms} ms is above the broker's "
        f"transaction.max.timeout.ms ({limit}). Lower sink.transaction_timeout_ms "
        "(env IPCOUNT_SINK_TRANSACTION_TIMEOUT_MS) "
        "or raise transaction.max.timeout.ms on the brokers."
    )
