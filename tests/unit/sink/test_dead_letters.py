"""A dead letter always fits: whatever key, headers and value a record holds (up to the broker's
limit), its dead letter stays under the producer's message.max.bytes as librdkafka and Kafka
count it, and every cut is said in a header (issue #38)."""

from __future__ import annotations

import hashlib

import pytest
from confluent_kafka import KafkaException, Producer
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ipcount.errors import ConfigError
from ipcount.sink.dead_letters import (
    HEADERS_CUT_HEADER,
    KEY_SIZE_HEADER,
    MIN_RECORD_BYTES,
    VALUE_SIZE_HEADER,
    DeadLetterLimits,
    bound_record,
    message_max_bytes,
)

BROKER_LIMIT = 1_048_588  # Kafka's default max.message.bytes
MARGIN = 256  # what the bound keeps free at least, beyond the exact sums below


def _sized(max_size: int) -> st.SearchStrategy[bytes]:
    """Bytes of any size up to `max_size`: random short ones, long ones of a repeated byte."""
    return st.one_of(
        st.binary(max_size=64),
        st.tuples(st.integers(0, max_size), st.binary(min_size=1, max_size=1)).map(
            lambda t: t[1] * t[0]
        ),
    )


_HEADERS = st.lists(
    st.tuples(st.text(max_size=80), st.one_of(st.none(), _sized(200_000))), max_size=12
)


def _varint(n: int) -> int:
    """Bytes of Kafka's zigzag varint for `n`."""
    z = (n << 1) ^ (n >> 63)
    size = 1
    while z >= 0x80:
        z >>= 7
        size += 1
    return size


def _kafka_batch_bytes(key: bytes | None, value: bytes | None, headers: list) -> int:
    """A v2 record batch holding this record alone, byte for byte as Kafka writes it (timestamp
    and offset deltas at their longest)."""
    body = 1 + 10 + 5  # attributes, timestamp delta, offset delta
    for field in (key, value):
        body += _varint(-1) if field is None else _varint(len(field)) + len(field)
    body += _varint(len(headers))
    for name, hvalue in headers:
        raw = name.encode()
        body += _varint(len(raw)) + len(raw)
        body += _varint(-1) if hvalue is None else _varint(len(hvalue)) + len(hvalue)
    return 61 + _varint(body) + body


def _librdkafka_bytes(key: bytes | None, value: bytes | None, headers: list) -> int:
    """What librdkafka compares with message.max.bytes at produce() (rd_kafka_msg_max_wire_size:
    its v2 per-record overhead, key, value, serialized headers)."""
    hdrs = sum(
        _varint(len(n.encode())) + len(n.encode()) + _varint(len(v or b"")) + len(v or b"")
        for n, v in headers
    )
    return 36 + len(key or b"") + len(value or b"") + hdrs


@pytest.fixture(scope="module")
def producer() -> Producer:
    # No broker: produce() checks a record's size before anything is sent.
    return Producer({"message.max.bytes": 1_000_000, "log_level": 0})


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    key=st.one_of(st.none(), _sized(BROKER_LIMIT)),
    value=st.one_of(st.none(), _sized(BROKER_LIMIT)),
    headers=_HEADERS,
    max_record=st.one_of(st.just(1_000_000), st.integers(MIN_RECORD_BYTES, 2_000_000)),
    max_value=st.one_of(st.none(), st.integers(1024, 2_000_000)),
)
def test_a_dead_letter_always_fits(
    producer: Producer,
    key: bytes | None,
    value: bytes | None,
    headers: list,
    max_record: int,
    max_value: int | None,
) -> None:
    out = bound_record(key, value, headers, DeadLetterLimits(max_record, max_value))
    assert _kafka_batch_bytes(out.key, out.value, out.headers) <= max_record - MARGIN
    assert _librdkafka_bytes(out.key, out.value, out.headers) <= max_record - MARGIN
    said = dict(out.headers)
    if key is not None and len(key) > 1024:
        assert out.key == b"sha256:" + hashlib.sha256(key).hexdigest().encode()
        assert said[KEY_SIZE_HEADER] == str(len(key)).encode()
    else:
        assert out.key == key and KEY_SIZE_HEADER not in said
    if value is not None and out.value != value:
        assert value.startswith(out.value or b"")
        assert said[VALUE_SIZE_HEADER] == str(len(value)).encode()
    if max_value is not None and value is not None:
        assert len(out.value or b"") <= max_value
    # librdkafka itself takes it, at exactly that limit.
    if max_record == 1_000_000:
        producer.produce("dead-letters", value=out.value, key=out.key, headers=out.headers)
        producer.purge(in_queue=True, in_flight=False)


def test_an_ordinary_record_is_its_own_dead_letter() -> None:
    headers = [("ipcount.reason", b"malformed: not UTF-8"), ("ipcount.source", b"src/0@7")]
    out = bound_record(b"10.0.0.1", b"\xff" * 5000, headers, DeadLetterLimits(1_000_000, 262_144))
    assert (out.key, out.value, out.headers) == (b"10.0.0.1", b"\xff" * 5000, headers)


def test_too_many_or_too_long_headers_are_cut_and_counted() -> None:
    headers = [(f"h{i}", b"v") for i in range(10)] + [("long", b"x" * 10_000)]
    out = bound_record(None, b"v", headers, DeadLetterLimits())
    said = dict(out.headers)
    assert said[HEADERS_CUT_HEADER] == b"3"  # two past the eighth, one too long (not kept)
    assert len(out.headers) == 9


def test_the_record_bound_is_the_smaller_of_the_producers_and_the_topics() -> None:
    assert message_max_bytes({}) == 1_000_000
    assert message_max_bytes({"message.max.bytes": "2000000"}) == 2_000_000
    assert message_max_bytes({"message.max.bytes": "2000000"}, 500_061) == 500_000
    with pytest.raises(ConfigError, match="kafka.producer.message.max.bytes"):
        message_max_bytes({"message.max.bytes": "lots"})
    with pytest.raises(ConfigError, match="message.max.bytes"):
        DeadLetterLimits(1000)


def test_a_record_too_large_for_the_producer_is_refused_without_the_bound(
    producer: Producer,
) -> None:
    """The failure the bound prevents: librdkafka refuses a ~1 MB key at produce()."""
    with pytest.raises(KafkaException, match="MSG_SIZE_TOO_LARGE"):
        producer.produce("dead-letters", key=b"k" * 1_000_000, value=b"not an access line")
