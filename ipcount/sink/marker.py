"""The progress marker: what a sink task's transaction writes to topics.progress beside its share of
a batch's results (keyed by query id and sink partition), and the driver's transaction after them
(keyed by query id: the whole batch); compacted. How a reader decodes it. JSON on the wire."""

from __future__ import annotations

import json
from dataclasses import dataclass, field, replace
from typing import TypeAlias, TypeVar

from ipcount.errors import SinkError

__all__ = ["JsonValue", "PARTITION_KEY_SEPARATOR", "ProgressMarker", "marker_key"]

# A value as json.loads returns it: the source's end offsets are kept as Spark's offset log has
# them ({"offsets": {topic: {partition: offset}}, ...}, a list for several sources, or null).
JsonValue: TypeAlias = None | bool | int | float | str | list["JsonValue"] | dict[str, "JsonValue"]

# The wire keys in the order earlier versions wrote them: a marker encodes to the same bytes, so
# existing topics and checkpoints keep working. Optional keys (None) are left out; `topic` and
# `sourceEnd` are always written (null when unknown), as before.
_OPTIONAL = ("lateRecords", "transactionalId", "adoptedFrom", "watermarkMs", "sinkPartition")
# A sink task's marker is keyed by its query id and this suffix with the task's sink partition:
# compaction keeps every partition's newest marker beside the query's.
PARTITION_KEY_SEPARATOR = "#p"

_T = TypeVar("_T", str, int)


@dataclass(frozen=True)
class ProgressMarker:
    """One committed batch of a query: what it wrote and what it consumed.

    `sink_partition` is set on a sink task's own marker: what that task
    wrote of the batch, in its own transaction; the query's marker (None) then sums them.
    `source_end` is the source's end offset of the batch as Spark's offset log holds it (None:
    unknown); `watermark_ms` the batch's watermark (every window ending at or before it is in
    the sink); `adopted_from` the query whose output a `--new-query` start took over (its marker
    of batch -1). `position` is where the marker was read or written, (partition, offset): known
    in memory only, never part of the record.
    """

    query_id: str
    batch_id: int
    run_id: str = ""
    records: int = 0
    topic: str | None = None
    source_end: JsonValue = None
    committed_at_ms: int | None = None
    late_records: int | None = None
    transactional_id: str | None = None
    adopted_from: str | None = None
    watermark_ms: int | None = None
    sink_partition: int | None = None
    position: tuple[int, int] | None = field(default=None, compare=False)

    @property
    def key(self) -> bytes:
        """The record's key (`marker_key`)."""
        return marker_key(self.query_id, self.sink_partition)

    def at(self, partition: int, offset: int) -> ProgressMarker:
        """This marker as found at `partition`/`offset` of the progress topic."""
        return replace(self, position=(partition, offset))

    def encode(self) -> bytes:
        body: dict[str, JsonValue] = {
            "queryId": self.query_id,
            "batchId": self.batch_id,
            "runId": self.run_id,
            "records": self.records,
            "lateRecords": self.late_records,
            "topic": self.topic,
            "sourceEnd": self.source_end,
            "transactionalId": self.transactional_id,
            "adoptedFrom": self.adopted_from,
            "committedAtMs": self.committed_at_ms,
            "watermarkMs": self.watermark_ms,
            "sinkPartition": self.sink_partition,
        }
        kept = {k: v for k, v in body.items() if v is not None or k not in _OPTIONAL}
        return json.dumps(kept, separators=(",", ":")).encode()

    @staticmethod
    def decode(value: bytes | None, *, where: str) -> ProgressMarker:
        """Decode one record's value; `where` (topic[partition]@offset and key) is named in the
        error. Keys an older ipcount did not write decode as their defaults.

        Raises:
            SinkError: the record is not a progress marker (topics.progress must be ipcount's own).
        """
        try:
            if value is None:
                raise ValueError("no value (a tombstone)")
            body = json.loads(value)
            if not isinstance(body, dict):
                raise ValueError(f"a JSON {type(body).__name__}, not an object")
            return ProgressMarker(
                query_id=_required(body, "queryId", str),
                batch_id=_required(body, "batchId", int),
                run_id=_typed(body, "runId", str) or "",
                records=_typed(body, "records", int) or 0,
                topic=_typed(body, "topic", str),
                source_end=body.get("sourceEnd"),
                committed_at_ms=_typed(body, "committedAtMs", int),
                late_records=_typed(body, "lateRecords", int),
                transactional_id=_typed(body, "transactionalId", str),
                adopted_from=_typed(body, "adoptedFrom", str),
                watermark_ms=_typed(body, "watermarkMs", int),
                sink_partition=_typed(body, "sinkPartition", int),
            )
        except ValueError as exc:
            raise SinkError(
                f"progress marker {where} is unreadable ({exc}); it was not written by "
                "ipcount: topics.progress must be ipcount's own topic"
            ) from exc


def marker_key(query_id: str, sink_partition: int | None = None) -> bytes:
    """The key of a query's markers, or of one of its sink tasks' (compaction keeps each query's
    and each of its partitions' newest marker)."""
    if sink_partition is None:
        return query_id.encode()
    return f"{query_id}{PARTITION_KEY_SEPARATOR}{sink_partition}".encode()


def _typed(body: dict[str, JsonValue], key: str, kind: type[_T]) -> _T | None:
    """body[key] when it is a `kind`; None when absent or null."""
    value = body.get(key)
    if value is None:
        return None
    # bool is an int to isinstance, never a batch id or a count.
    if not isinstance(value, kind) or isinstance(value, bool):
        raise ValueError(f'"{key}" is {value!r}, not a {kind.__name__}')
    return value


def _required(body: dict[str, JsonValue], key: str, kind: type[_T]) -> _T:
    value = _typed(body, key, kind)
    if value is None:
        raise ValueError(f'no "{key}"')
    return value
