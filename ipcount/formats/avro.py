"""Avro for the sink's IpCount records: the .avsc (their one definition), single-object encoding
and the Confluent Schema Registry wire format (optional extra). Executors and consumers."""

from __future__ import annotations

import copy
import dataclasses
import datetime as dt
import functools
import importlib.resources
import io
import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Protocol

import fastavro
from fastavro.schema import fingerprint, parse_schema, to_parsing_canonical_form

from ipcount.config.settings import WIRE_FORMATS
from ipcount.errors import ConfigError, DecodeError, SchemaError

__all__ = [
    "SCHEMA_FILE",
    "SINGLE_OBJECT_MAGIC",
    "WIRE_FORMATS",
    "RECORD_FIELDS",
    "KEY_FIELD",
    "IpCount",
    "Codec",
    "SingleObjectCodec",
    "ConfluentCodec",
    "load_schema",
    "canonical_form",
    "schema_fingerprint",
    "make_codec",
]

SCHEMA_FILE = "ip_count.avsc"
# Avro single-object encoding: 0xC3 0x01, then the 8-byte little-endian CRC-64-AVRO fingerprint.
SINGLE_OBJECT_MAGIC = b"\xc3\x01"
_HEADER_LEN = len(SINGLE_OBJECT_MAGIC) + 8
_INT64_MIN, _INT64_MAX = -(2**63), 2**63 - 1
_EPOCH = dt.datetime(1970, 1, 1, tzinfo=dt.UTC)
_TIMESTAMP = "timestamp-millis"
# The record key is this field, UTF-8 (the .avsc's doc says so).
KEY_FIELD = "ip"
# The Python type of each Avro type the .avsc uses (timestamp-millis: epoch ms).
_PYTHON_TYPES: dict[str, type] = {_TIMESTAMP: int, "long": int, "string": str}


@dataclass(frozen=True, slots=True)
class IpCount:
    """One sink result: requests of `ip` in [window_start, window_end) (epoch ms, UTC).

    The typed Python view of ip_count.avsc, for mypy; checked against the .avsc when this module
    loads (`_check_matches_schema`), so the .avsc stays the one definition of the fields.
    """

    window_start: int
    window_end: int
    ip: str
    count: int


class Codec(Protocol):
    """Turns IpCount records into Kafka record values and back."""

    wire_format: str

    def encode(self, record: Mapping[str, Any]) -> bytes: ...

    def decode(self, data: bytes) -> IpCount: ...


@functools.cache
def load_schema(name: str = SCHEMA_FILE) -> dict[str, Any]:
    """The schema shipped in ipcount/schemas as parsed JSON (cached and shared: do not mutate).

    Raises:
        SchemaError: the file is missing or not valid Avro.
    """
    try:
        text = (importlib.resources.files("ipcount") / "schemas" / name).read_text(encoding="utf-8")
        raw = json.loads(text)
        parse_schema(copy.deepcopy(raw))
    except (OSError, ValueError, fastavro.schema.SchemaParseException) as exc:
        raise SchemaError(f"cannot load Avro schema ipcount/schemas/{name}: {exc}") from exc
    return dict(raw)


def _field_types(schema: Mapping[str, Any]) -> dict[str, str]:
    """Each field of a record schema and its Avro type (the logical type where there is one)."""
    types: dict[str, str] = {}
    for f in schema["fields"]:
        kind = f["type"]
        types[f["name"]] = str(
            kind.get("logicalType", kind["type"]) if isinstance(kind, dict) else kind
        )
    return types


# IpCount's fields in .avsc order, with their Avro types ("timestamp-millis", "string", "long").
RECORD_FIELDS: dict[str, str] = _field_types(load_schema())


def _check_matches_schema() -> None:
    wanted = [(name, _PYTHON_TYPES[kind].__name__) for name, kind in RECORD_FIELDS.items()]
    got = [(f.name, str(f.type)) for f in dataclasses.fields(IpCount)]
    if got != wanted:
        raise SchemaError(
            f"IpCount's fields {got} differ from ipcount/schemas/{SCHEMA_FILE}'s {wanted}"
        )


_check_matches_schema()


def canonical_form(schema: Mapping[str, Any]) -> str:
    """The Avro Parsing Canonical Form of a schema (what the fingerprint is computed over)."""
    return str(to_parsing_canonical_form(parse_schema(copy.deepcopy(dict(schema)))))


def schema_fingerprint(schema: Mapping[str, Any]) -> bytes:
    """The 8-byte little-endian CRC-64-AVRO (Rabin) fingerprint of the schema's canonical form."""
    # fastavro renders the 64-bit fingerprint as the hex of its little-endian bytes.
    return bytes.fromhex(fingerprint(canonical_form(schema), "CRC-64-AVRO"))


def _without_logical_types(schema: Mapping[str, Any]) -> Any:
    # The binary encoding is the same with or without logicalType; plain longs skip fastavro's
    # datetime conversion on both sides (about 30% faster) and give us epoch ms directly.
    plain = copy.deepcopy(dict(schema))
    for f in plain["fields"]:
        if isinstance(f["type"], dict) and "logicalType" in f["type"]:
            f["type"] = f["type"]["type"]
    return parse_schema(plain)


def _check_record(record: Mapping[str, Any]) -> dict[str, Any]:
    """Validate first: fastavro accepts floats and bools for longs and ignores extra fields."""
    if not isinstance(record, Mapping):
        raise SchemaError(f"an IpCount record must be a mapping, got {type(record).__name__}")
    keys = set(record)
    if keys != RECORD_FIELDS.keys():
        missing = [f for f in RECORD_FIELDS if f not in keys]
        extra = sorted(str(k) for k in keys - RECORD_FIELDS.keys())
        raise SchemaError(
            f"IpCount record fields: missing {missing}, unexpected {extra}: {dict(record)!r}"
        )
    out = dict(record)
    for name, kind in RECORD_FIELDS.items():
        value = out[name]
        if kind == "string":
            if not isinstance(value, str):
                raise SchemaError(
                    f"IpCount.{name} must be a string, got {value!r} in {dict(record)!r}"
                )
            continue
        if kind == _TIMESTAMP and isinstance(value, dt.datetime):
            if value.tzinfo is None:
                raise SchemaError(
                    f"IpCount.{name} must be epoch ms or an aware datetime, got {value!r}"
                )
            value = (value - _EPOCH) // dt.timedelta(milliseconds=1)
            out[name] = value
        _check_long(name, value, record)
    return out


def _check_long(name: str, value: Any, record: Mapping[str, Any]) -> None:
    if not isinstance(value, int) or isinstance(value, bool):
        raise SchemaError(
            f"IpCount.{name} must be a whole number (long), got {value!r} in {dict(record)!r}"
        )
    if not _INT64_MIN <= value <= _INT64_MAX:
        raise SchemaError(f"IpCount.{name} = {value} does not fit in an Avro long")


class SingleObjectCodec:
    """Avro single-object encoding: C3 01 + fingerprint + Avro binary body.

    Readers check the fingerprint, so a consumer with a different schema fails loudly
    (DecodeError) instead of misreading bytes.
    """

    wire_format = "single-object"

    def __init__(self, schema: Mapping[str, Any] | None = None) -> None:
        self.schema = dict(schema) if schema is not None else load_schema()
        self.fingerprint = schema_fingerprint(self.schema)
        self.header = SINGLE_OBJECT_MAGIC + self.fingerprint
        self._parsed = _without_logical_types(self.schema)
        self._buf = io.BytesIO()

    def encode(self, record: Mapping[str, Any]) -> bytes:
        """Encode one record.

        Raises:
            SchemaError: a field is missing, extra, of the wrong type or out of range.
        """
        checked = _check_record(record)
        buf = self._buf
        buf.seek(0)
        buf.truncate()
        buf.write(self.header)
        fastavro.schemaless_writer(buf, self._parsed, checked)
        return buf.getvalue()

    def decode(self, data: bytes) -> IpCount:
        """Decode one record value.

        Raises:
            DecodeError: not single-object encoded, another schema's fingerprint, truncated or
                trailing bytes, invalid UTF-8.
        """
        if data is None:
            raise DecodeError("record value is null (a tombstone), not an IpCount")
        if len(data) < _HEADER_LEN or data[:2] != SINGLE_OBJECT_MAGIC:
            hint = ""
            if data[:1] == b"\x00" and len(data) >= 5:
                hint = (
                    " (it looks like the Confluent wire format: set sink.wire_format = 'confluent')"
                )
            raise DecodeError(
                f"value is not Avro single-object encoded: starts with {bytes(data[:4]).hex()!r}, "
                f"expected c301 + 8-byte fingerprint{hint}"
            )
        got = bytes(data[2:_HEADER_LEN])
        if got != self.fingerprint:
            raise DecodeError(
                f"schema fingerprint {got.hex()} does not match ip_count.avsc "
                f"({self.fingerprint.hex()}): the record was written with another schema"
            )
        stream = io.BytesIO(data)
        stream.seek(_HEADER_LEN)
        try:
            rec = fastavro.schemaless_reader(stream, self._parsed, None)
        except Exception as exc:  # fastavro raises EOF/Index/Unicode/Value errors on bad bytes
            raise DecodeError(
                f"corrupt Avro body ({type(exc).__name__}: {exc or 'truncated'})"
            ) from exc
        if stream.tell() != len(data):
            raise DecodeError(f"{len(data) - stream.tell()} trailing bytes after the Avro body")
        if not isinstance(rec, dict):
            raise DecodeError(f"Avro body decoded to {type(rec).__name__}, not a record")
        return IpCount(**rec)


class ConfluentCodec:
    """The Confluent wire format (0x00 + 4-byte schema id + Avro body) via the Schema Registry.

    Needs the `registry` extra (pip install 'ipcount[registry]'); imported only when used.
    """

    wire_format = "confluent"

    def __init__(
        self, schema_registry_url: str, topic: str, schema: Mapping[str, Any] | None = None
    ) -> None:
        if not schema_registry_url:
            raise ConfigError(
                "sink.schema_registry_url must be set when sink.wire_format = 'confluent'"
            )
        modules = _registry_modules()
        self.schema = dict(schema) if schema is not None else load_schema()
        self.topic = topic
        client = modules["SchemaRegistryClient"]({"url": schema_registry_url})
        schema_str = json.dumps(self.schema)
        self._serializer = modules["AvroSerializer"](client, schema_str)
        self._deserializer = modules["AvroDeserializer"](client, schema_str)
        self._ctx = modules["SerializationContext"](topic, modules["MessageField"].VALUE)

    def encode(self, record: Mapping[str, Any]) -> bytes:
        """Encode one record, registering the schema under '<topic>-value' on first use."""
        checked = _check_record(record)
        try:
            return bytes(self._serializer(checked, self._ctx))
        except Exception as exc:  # the registry client raises many types (HTTP, serialization)
            raise SchemaError(
                f"Confluent Avro serialization for topic {self.topic} failed: {exc}"
            ) from exc

    def decode(self, data: bytes) -> IpCount:
        """Decode one Confluent-framed value (the writer schema is fetched by id)."""
        if not data or data[:1] != b"\x00":
            raise DecodeError("value is not in the Confluent wire format (no 0x00 magic byte)")
        try:
            rec = self._deserializer(data, self._ctx)
        except Exception as exc:
            raise DecodeError(f"Confluent Avro deserialization failed: {exc}") from exc
        fields: dict[str, Any] = {
            k: _to_ms(v) if RECORD_FIELDS[k] == _TIMESTAMP else v for k, v in rec.items()
        }
        return IpCount(**fields)


def _to_ms(value: Any) -> int:
    if isinstance(value, dt.datetime):
        return (value - _EPOCH) // dt.timedelta(milliseconds=1)
    return int(value)


def _registry_modules() -> dict[str, Any]:
    try:
        from confluent_kafka.schema_registry import SchemaRegistryClient
        from confluent_kafka.schema_registry.avro import AvroDeserializer, AvroSerializer
        from confluent_kafka.serialization import MessageField, SerializationContext
    except ImportError as exc:
        raise ConfigError(
            "sink.wire_format = 'confluent' needs the Schema Registry client, which is not "
            f"installed ({exc}): pip install 'ipcount[registry]', "
            "or set sink.wire_format = 'single-object'"
        ) from exc
    return {
        "SchemaRegistryClient": SchemaRegistryClient,
        "AvroSerializer": AvroSerializer,
        "AvroDeserializer": AvroDeserializer,
        "MessageField": MessageField,
        "SerializationContext": SerializationContext,
    }


def make_codec(wire_format: str, schema_registry_url: str = "", topic: str = "") -> Codec:
    """The codec for a wire format.

    Args:
        wire_format: 'single-object' or 'confluent' (sink.wire_format).
        schema_registry_url: required for 'confluent' (sink.schema_registry_url).
        topic: the sink topic (the Confluent subject is '<topic>-value').

    Raises:
        ConfigError: unknown wire format, missing URL, or the registry extra is not installed.
    """
    if wire_format == "single-object":
        return SingleObjectCodec()
    if wire_format == "confluent":
        return ConfluentCodec(schema_registry_url, topic)
    raise ConfigError(
        f"sink.wire_format must be one of {', '.join(WIRE_FORMATS)}, got {wire_format!r}"
    )
