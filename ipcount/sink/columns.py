"""The sink's input columns (executor): the schema check of each mode and the Arrow columns as
the values the encoders take."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pyspark.sql import types as T

from ipcount.errors import SchemaError

__all__ = ["check_schema", "millis", "bytes_column"]

# Arrow timestamp unit -> divisor to epoch milliseconds (Avro timestamp-millis).
_TO_MS = {"s": None, "ms": 1, "us": 1000, "ns": 1_000_000}


def check_schema(
    schema: T.StructType,
    required: Mapping[str, tuple[type[T.DataType], ...]],
    mode: str,
    optional: Mapping[str, tuple[type[T.DataType], ...]] | None = None,
) -> list[str]:
    got = {f.name: f.dataType for f in schema.fields}
    wanted = {**required, **{k: v for k, v in (optional or {}).items() if k in got}}
    problems = [f"missing column {name}" for name in required if name not in got]
    problems += [
        f"column {name} is {got[name].simpleString()}, expected "
        + " or ".join(t().simpleString() for t in types)
        for name, types in wanted.items()
        if name in got and not isinstance(got[name], types)
    ]
    problems += [f"unexpected column {name}" for name in got if name not in wanted]
    if problems:
        raise SchemaError(
            f"ipcount-kafka-txn sink (mode {mode}) input: {'; '.join(problems)}; "
            f"expected columns {', '.join(wanted)} (got {schema.simpleString()})"
        )
    return list(wanted)


def millis(batch: Any, name: str) -> list[int | None]:
    import pyarrow as pa

    column = batch.column(name)
    divisor = _TO_MS[column.type.unit]
    values = column.cast(pa.int64()).to_pylist()
    if divisor is None:
        return [v * 1000 if v is not None else None for v in values]
    if divisor == 1:
        return values  # type: ignore[no-any-return]
    return [v // divisor if v is not None else None for v in values]


def bytes_column(column: Any) -> list[bytes | None]:
    values = column.to_pylist()
    if column.type in ("string", "large_string") or str(column.type) in ("string", "large_string"):
        return [v.encode("utf-8") if v is not None else None for v in values]
    return values  # type: ignore[no-any-return]
