"""The Arrow forms of the source's schemas (source.schema): what the read tasks yield. Each is
derived from its Spark schema the way Spark derives the form it checks every yielded batch
against (`to_arrow_schema(..., timezone="UTC")` in its read planner), so the two cannot differ."""

from __future__ import annotations

import pyarrow as pa
from pyspark.sql.pandas.types import to_arrow_schema

from ipcount.source.schema import COUNTS_SCHEMA, REJECTS_SCHEMA, SCHEMA

__all__ = ["TIMESTAMP", "RECORDS_ARROW_SCHEMA", "COUNTS_ARROW_SCHEMA", "REJECTS_ARROW_SCHEMA"]

# Spark's TimestampType in Arrow: microseconds since the epoch, UTC.
TIMESTAMP = pa.timestamp("us", tz="UTC")

RECORDS_ARROW_SCHEMA: pa.Schema = to_arrow_schema(SCHEMA, timezone="UTC")
COUNTS_ARROW_SCHEMA: pa.Schema = to_arrow_schema(COUNTS_SCHEMA, timezone="UTC")
REJECTS_ARROW_SCHEMA: pa.Schema = to_arrow_schema(REJECTS_SCHEMA, timezone="UTC")
