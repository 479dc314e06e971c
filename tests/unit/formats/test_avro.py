"""Avro encoding of sink results: round trips, invalid records, fingerprints, wire-format errors."""

from __future__ import annotations

import datetime as dt
import importlib.util
import io
import json

import fastavro
import pytest

from ipcount.errors import ConfigError, DecodeError, SchemaError
from ipcount.formats.avro import (
    SINGLE_OBJECT_MAGIC,
    IpCount,
    SingleObjectCodec,
    canonical_form,
    load_schema,
    make_codec,
    schema_fingerprint,
)

# An independent CRC-64-AVRO (Rabin) implementation, straight from the Avro specification.
_EMPTY = 0xC15D213AA4D7A795
_TABLE = []
for _i in range(256):
    _fp = _i
    for _ in range(8):
        _fp = (_fp >> 1) ^ (_EMPTY & -(_fp & 1))
    _TABLE.append(_fp)


def _rabin(data: bytes) -> int:
    fp = _EMPTY
    for byte in data:
        fp = (fp >> 8) ^ _TABLE[(fp ^ byte) & 0xFF]
    return fp


@pytest.fixture(scope="module")
def codec() -> SingleObjectCodec:
    return SingleObjectCodec()


def _rec(**changes: object) -> dict[str, object]:
    base: dict[str, object] = {
        "window_start": 1_700_000_000_000,
        "window_end": 1_700_000_005_000,
        "ip": "203.0.113.7",
        "count": 42,
    }
    base.update(changes)
    return base


def test_schema_is_documented_record_with_timestamp_millis() -> None:
    schema = load_schema()
    assert schema["type"] == "record" and schema["namespace"] and schema["doc"]
    fields = {f["name"]: f for f in schema["fields"]}
    assert list(fields) == ["window_start", "window_end", "ip", "count"]
    for name in ("window_start", "window_end"):
        assert fields[name]["type"] == {"type": "long", "logicalType": "timestamp-millis"}
    assert fields["ip"]["type"] == "string" and fields["count"]["type"] == "long"
    assert all(f.get("doc") for f in schema["fields"])


def test_fingerprint_is_little_endian_crc64_avro_of_canonical_form() -> None:
    # Test vector from the Avro spec: the schema "null" has fingerprint 0x63dd24e7cc258f8a.
    assert _rabin(b'"null"') == 0x63DD24E7CC258F8A
    fp = schema_fingerprint(load_schema())
    assert fp == _rabin(canonical_form(load_schema()).encode()).to_bytes(8, "little")
    assert SingleObjectCodec().header == SINGLE_OBJECT_MAGIC + fp


@pytest.mark.parametrize(
    "record",
    [
        _rec(),
        _rec(ip="2001:db8::1", count=1),
        _rec(window_start=0, window_end=5000, count=2**63 - 1),
        _rec(window_start=-5000, window_end=0, count=0),
        _rec(ip="", count=-1),
        _rec(ip="ünïcödé"),
    ],
)
def test_round_trip(codec: SingleObjectCodec, record: dict[str, object]) -> None:
    data = codec.encode(record)
    assert data[:10] == codec.header
    assert codec.decode(data) == IpCount(**record)  # type: ignore[arg-type]
    # Any Avro reader with the .avsc decodes the body (logical types become datetimes).
    body = fastavro.schemaless_reader(io.BytesIO(data[10:]), fastavro.parse_schema(load_schema()))
    assert body["count"] == record["count"] and body["ip"] == record["ip"]


def test_aware_datetimes_are_encoded_as_epoch_millis(codec: SingleObjectCodec) -> None:
    start = dt.datetime(2024, 1, 2, 3, 4, 5, 678000, tzinfo=dt.UTC)
    data = codec.encode(_rec(window_start=start, window_end=start + dt.timedelta(seconds=5)))
    got = codec.decode(data)
    assert got.window_start == int(start.timestamp() * 1000)
    assert got.window_end - got.window_start == 5000


@pytest.mark.parametrize(
    ("record", "message"),
    [
        (_rec(ip=None), "ip must be a string"),
        (_rec(ip=123), "ip must be a string"),
        (_rec(count="5"), "count must be a whole number"),
        (_rec(count=5.0), "count must be a whole number"),
        (_rec(count=True), "count must be a whole number"),
        (_rec(count=None), "count must be a whole number"),
        (_rec(count=2**63), "does not fit in an Avro long"),
        (_rec(window_start="2024-01-01"), "window_start must be a whole number"),
        (_rec(window_end=dt.datetime(2024, 1, 1)), "aware datetime"),
        ({k: v for k, v in _rec().items() if k != "count"}, "missing ['count']"),
        (_rec(extra=1), "unexpected ['extra']"),
        (["not", "a", "mapping"], "must be a mapping"),
    ],
)
def test_invalid_records_are_rejected(
    codec: SingleObjectCodec, record: object, message: str
) -> None:
    with pytest.raises(SchemaError, match=message.replace("[", r"\[").replace("]", r"\]")):
        codec.encode(record)  # type: ignore[arg-type]


def _other_schema_header() -> bytes:
    other = json.loads(json.dumps(load_schema()))
    other["fields"][3]["type"] = "int"
    return SINGLE_OBJECT_MAGIC + schema_fingerprint(other)


@pytest.mark.parametrize(
    ("mutate", "message"),
    [
        (lambda d: d[:5], "not Avro single-object encoded"),
        (lambda d: b"", "not Avro single-object encoded"),
        (lambda d: b"\x00\x00\x00\x00\x01" + d[10:], "looks like the Confluent wire format"),
        (lambda d: b"\xc3\x02" + d[2:], "not Avro single-object encoded"),
        (lambda d: _other_schema_header() + d[10:], "fingerprint .* does not match"),
        (lambda d: d[:-1], "corrupt Avro body"),
        (lambda d: d[:12], "corrupt Avro body"),
        (lambda d: d[:10], "corrupt Avro body"),
        (lambda d: d + b"\x00", "1 trailing bytes"),
        # ip length 2 followed by invalid UTF-8.
        (lambda d: d[:10] + b"\x02\x04\x04\xff\xfe\x02", "corrupt Avro body"),
        # A negative string length.
        (lambda d: d[:10] + b"\x02\x04\x03\xff\xfe\x02", "corrupt Avro body"),
    ],
)
def test_invalid_bytes_are_decode_errors(codec: SingleObjectCodec, mutate, message: str) -> None:
    with pytest.raises(DecodeError, match=message):
        codec.decode(mutate(codec.encode(_rec())))


def test_null_value_is_a_decode_error(codec: SingleObjectCodec) -> None:
    with pytest.raises(DecodeError, match="tombstone"):
        codec.decode(None)  # type: ignore[arg-type]


def test_make_codec_rejects_unknown_wire_format() -> None:
    with pytest.raises(
        ConfigError, match="sink.wire_format must be one of single-object, confluent"
    ):
        make_codec("json")


def test_confluent_needs_a_registry_url() -> None:
    with pytest.raises(ConfigError, match="sink.schema_registry_url must be set"):
        make_codec("confluent", "", "ip_count_sink")


def _registry_extra_installed() -> bool:
    try:
        return importlib.util.find_spec(
            "confluent_kafka.schema_registry.avro"
        ) is not None and bool(__import__("confluent_kafka.schema_registry.avro"))
    except ImportError:
        return False


@pytest.mark.skipif(_registry_extra_installed(), reason="the registry extra is installed here")
def test_confluent_without_the_extra_names_the_fix() -> None:
    with pytest.raises(ConfigError, match=r"pip install 'ipcount\[registry\]'"):
        make_codec("confluent", "http://127.0.0.1:1", "ip_count_sink")


def test_the_record_fields_are_the_avscs() -> None:
    # The .avsc is the one definition of IpCount's fields: the codec's check and the typed
    # IpCount follow it (the sink's input columns too: tests/unit/sink/test_writer_options.py).
    import dataclasses

    from ipcount.formats.avro import RECORD_FIELDS

    fields = load_schema()["fields"]
    assert list(RECORD_FIELDS) == [f["name"] for f in fields]
    assert RECORD_FIELDS == {
        "window_start": "timestamp-millis",
        "window_end": "timestamp-millis",
        "ip": "string",
        "count": "long",
    }
    assert [f.name for f in dataclasses.fields(IpCount)] == list(RECORD_FIELDS)
