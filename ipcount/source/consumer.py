"""The source's Kafka consumer: creation with the source's logging, and what its driver and
executor sides share."""

from __future__ import annotations

from collections.abc import Mapping
from typing import cast

from confluent_kafka import Consumer, KafkaException, Message

from ipcount.errors import SourceError
from ipcount.kafka.client import describe_kafka_error, with_client_logging

__all__ = ["CONSUME_TIMEOUT_S", "DRIVER_TIMEOUT_S", "new_consumer", "offset_of"]

# How long one consume() call waits; short, because a range's last offsets may be control
# records that never arrive as messages (the position still moves past them).
CONSUME_TIMEOUT_S = 0.1
# Driver lookups (metadata, offsets, tail reads) give up after this long.
DRIVER_TIMEOUT_S = 30.0


def offset_of(msg: Message) -> int:
    # Only data messages reach here; their offset is always set.
    return cast(int, msg.offset())


def new_consumer(conf: Mapping[str, str]) -> Consumer:
    try:
        return Consumer(with_client_logging(conf, "ipcount.source.librdkafka"))
    except KafkaException as exc:
        raise SourceError(
            "cannot create the Kafka consumer (check the kafka.* options): "
            f"{describe_kafka_error(exc)}"
        ) from exc
