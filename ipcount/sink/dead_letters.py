"""Dead letters that always fit (executors): a rejected record's key, value and headers bounded so
the whole record stays under the producer's `message.max.bytes`, each cut said in a header."""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from ipcount.errors import ConfigError

if TYPE_CHECKING:
    from ipcount.config import Settings

__all__ = [
    "DEFAULT_MESSAGE_MAX_BYTES",
    "MAX_KEY_BYTES",
    "MIN_RECORD_BYTES",
    "KEY_SIZE_HEADER",
    "VALUE_SIZE_HEADER",
    "HEADERS_CUT_HEADER",
    "DeadLetterLimits",
    "BoundRecord",
    "bound_record",
    "record_bytes",
    "message_max_bytes",
    "dead_letter_record_bytes",
]

logger = logging.getLogger(__name__)

Header = tuple[str, bytes | None]

# librdkafka's default message.max.bytes (the producer refuses a larger record at produce()).
DEFAULT_MESSAGE_MAX_BYTES = 1_000_000
# A longer key is replaced by `sha256:<hex digest>` (71 bytes): the same key, the same digest.
MAX_KEY_BYTES = 1024
# Headers kept from the record (ipcount's own come on top): how many, and each name's and value's
# length; the rest is cut or left out, and HEADERS_CUT_HEADER says how many were.
MAX_HEADERS, MAX_HEADER_NAME_BYTES, MAX_HEADER_VALUE_BYTES = 8, 64, 512
KEY_SIZE_HEADER = "ipcount.original.key.size"
VALUE_SIZE_HEADER = "ipcount.original.size"
HEADERS_CUT_HEADER = "ipcount.headers.cut"
# Kept free under the limit whatever the sizes count: librdkafka's and the broker's sums differ
# by a few bytes between versions.
_SAFETY_MARGIN = 512
# A Kafka v2 record batch's header (a record alone in its batch is checked against the topic's
# max.message.bytes with it) and librdkafka's most per record (RD_KAFKAP_MESSAGE_V2_MAX_OVERHEAD:
# length, attributes, timestamp delta, offset delta, key and value lengths as varints).
_BATCH_OVERHEAD, _RECORD_OVERHEAD = 61, 36
# A header's name and value lengths (varints) and the header count (varint): at most 5 bytes each.
_VARINT = 5
# The least message.max.bytes the bounds fit in (librdkafka's own minimum is 1,000).
MIN_RECORD_BYTES = 16_384


def record_bytes(key: bytes | None, value: bytes | None, headers: Sequence[Header]) -> int:
    """A record's size as librdkafka checks it against message.max.bytes (key, value, serialized
    headers and its v2 per-record overhead), plus the batch header the broker counts when the
    record is alone in its batch: an upper bound of both."""
    size = _BATCH_OVERHEAD + _RECORD_OVERHEAD + len(key or b"") + len(value or b"")
    if headers:
        size += _VARINT + sum(len(n.encode()) + len(v or b"") + 2 * _VARINT for n, v in headers)
    return size


@dataclass(frozen=True)
class DeadLetterLimits:
    """`max_record_bytes`: what the whole record must stay under (the producer's
    message.max.bytes, or the dead-letter topic's max.message.bytes when smaller);
    `max_value_bytes`: job.dead_letter_max_bytes (a longer value is cut to it)."""

    max_record_bytes: int = DEFAULT_MESSAGE_MAX_BYTES
    max_value_bytes: int | None = None

    def __post_init__(self) -> None:
        if self.max_record_bytes < MIN_RECORD_BYTES:
            raise ConfigError(
                f"dead letters: the largest record the producer or the dead-letter topic takes "
                f"({self.max_record_bytes} bytes) is below {MIN_RECORD_BYTES}: raise "
                "kafka.producer.message.max.bytes or the topic's max.message.bytes"
            )


@dataclass(frozen=True)
class BoundRecord:
    key: bytes | None
    value: bytes | None
    headers: list[Header]


def bound_record(
    key: bytes | None,
    value: bytes | None,
    headers: Sequence[Header],
    limits: DeadLetterLimits,
) -> BoundRecord:
    """The dead letter of a record: its key (a digest when longer than MAX_KEY_BYTES), its headers
    (bounded in number and length), then its value, cut to what is left under
    `limits.max_record_bytes` (and to `limits.max_value_bytes`). Each cut adds a header giving the
    original size (KEY_SIZE_HEADER, VALUE_SIZE_HEADER) or how many headers were cut
    (HEADERS_CUT_HEADER). The result's `record_bytes` never exceeds the limit less a margin."""
    out_headers, cut = _bounded_headers(headers)
    if cut:
        out_headers.append((HEADERS_CUT_HEADER, str(cut).encode()))
    if key is not None and len(key) > MAX_KEY_BYTES:
        out_headers.append((KEY_SIZE_HEADER, str(len(key)).encode()))
        key = b"sha256:" + hashlib.sha256(key).hexdigest().encode()
    if value is None:
        return BoundRecord(key, value, out_headers)
    # Room for the value with the header that would say it was cut (its number at its longest).
    room = (
        limits.max_record_bytes
        - _SAFETY_MARGIN
        - record_bytes(key, b"", [*out_headers, (VALUE_SIZE_HEADER, b"9" * 20)])
    )
    limit = room if limits.max_value_bytes is None else min(room, limits.max_value_bytes)
    if len(value) > limit:
        out_headers.append((VALUE_SIZE_HEADER, str(len(value)).encode()))
        value = value[: max(limit, 0)]
    return BoundRecord(key, value, out_headers)


def _bounded_headers(headers: Sequence[Header]) -> tuple[list[Header], int]:
    """At most MAX_HEADERS headers, names and values cut to their bounds; how many were cut or
    left out."""
    kept: list[Header] = []
    cut = max(len(headers) - MAX_HEADERS, 0)
    for name, value in headers[:MAX_HEADERS]:
        raw_name = name.encode()
        if len(raw_name) > MAX_HEADER_NAME_BYTES or len(value or b"") > MAX_HEADER_VALUE_BYTES:
            cut += 1
            name = raw_name[:MAX_HEADER_NAME_BYTES].decode("utf-8", "ignore")
            value = None if value is None else value[:MAX_HEADER_VALUE_BYTES]
        kept.append((name, value))
    return kept, cut


def message_max_bytes(producer_conf: Mapping[str, str], topic_max: int | None = None) -> int:
    """The largest record the dead-letter producer sends and the topic takes: the producer's
    message.max.bytes (librdkafka's default when unset), or the topic's max.message.bytes less a
    batch header when that is smaller.

    Raises:
        ConfigError: message.max.bytes is not a number.
    """
    raw = producer_conf.get("message.max.bytes", "")
    try:
        producer_max = int(raw) if str(raw).strip() else DEFAULT_MESSAGE_MAX_BYTES
    except ValueError:
        raise ConfigError(
            f"kafka.producer.message.max.bytes must be a number of bytes, got {raw!r}"
        ) from None
    if topic_max is None:
        return producer_max
    return min(producer_max, topic_max - _BATCH_OVERHEAD)


def dead_letter_record_bytes(settings: Settings) -> int:
    """The bound of a dead letter for this job (driver): `message_max_bytes` of the configured
    producer (kafka.* and kafka.producer.*) and of topics.dead_letter's max.message.bytes, read
    from the broker (the producer's alone when the broker does not say)."""
    from confluent_kafka import KafkaException
    from confluent_kafka.admin import ConfigResource, ResourceType

    from ipcount.kafka.client import admin_client, describe_kafka_error

    topic = settings.topics.dead_letter
    timeout = settings.kafka.connect_timeout_seconds
    topic_max: int | None = None
    try:
        admin = admin_client(settings.kafka.to_librdkafka("admin"))
        futures = admin.describe_configs([ConfigResource(ResourceType.TOPIC, topic)])
        for fut in futures.values():
            entry = fut.result(timeout=timeout).get("max.message.bytes")
            if entry is not None and entry.value not in (None, ""):
                topic_max = int(entry.value)
    except (KafkaException, ValueError) as exc:
        logger.info(
            "max.message.bytes of %s unknown (%s): dead letters are bounded by the producer's "
            "message.max.bytes alone",
            topic,
            describe_kafka_error(exc),
        )
    bound = message_max_bytes(settings.kafka.to_librdkafka("producer"), topic_max)
    logger.info("dead letters to %s are kept under %d bytes each", topic, bound)
    return bound
