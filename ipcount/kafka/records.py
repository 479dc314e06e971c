"""A Kafka record as a TopicReader returns it, and the decoding of the IpCount results it holds."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass

from ipcount.errors import DecodeError
from ipcount.formats.avro import Codec, IpCount

__all__ = ["SinkRecord", "decode_records"]


@dataclass(frozen=True)
class SinkRecord:
    """One Kafka record as read: where it is, its key and value bytes, its timestamp (ms)."""

    topic: str
    partition: int
    offset: int
    key: bytes | None
    value: bytes | None
    timestamp_ms: int
    headers: list[tuple[str, bytes]] | None = None

    @property
    def where(self) -> str:
        """topic[partition]@offset, for messages."""
        return f"{self.topic}[{self.partition}]@{self.offset}"


def decode_records(
    records: Iterable[SinkRecord], codec: Codec
) -> Iterator[tuple[SinkRecord, IpCount]]:
    """Decode each record's value.

    Raises:
        DecodeError: naming topic, partition and offset of the first bad record.
    """
    for rec in records:
        try:
            yield rec, codec.decode(rec.value)  # type: ignore[arg-type]
        except DecodeError as exc:
            raise DecodeError(f"{rec.where}: {exc}") from exc
