"""The schemas of the `ipcount-kafka` source, one per `output` option: each written once, in Arrow
(what the read tasks yield), with Spark's `StructType` derived from it (driver and executors)."""

from __future__ import annotations

import pyarrow as pa
from pyspark.sql.pandas.types import from_arrow_schema
from pyspark.sql.types import StructType

__all__ = [
    "TIMESTAMP",
    "RECORDS_ARROW_SCHEMA",
    "COUNTS_ARROW_SCHEMA",
    "REJECTS_ARROW_SCHEMA",
    "SCHEMA",
    "COUNTS_SCHEMA",
    "REJECTS_SCHEMA",
    "schema_for",
]

# Spark's TimestampType in Arrow: microseconds since the epoch, UTC.
TIMESTAMP = pa.timestamp("us", tz="UTC")

# output=records: Spark's Kafka source schema plus `heartbeat` and `late_before`.
RECORDS_ARROW_SCHEMA = pa.schema(
    [
        pa.field("key", pa.binary()),
        pa.field("value", pa.binary()),
        pa.field("topic", pa.string()),
        pa.field("partition", pa.int32()),
        pa.field("offset", pa.int64()),
        pa.field("timestamp", TIMESTAMP),
        pa.field("timestampType", pa.int32()),
        pa.field("heartbeat", pa.bool_()),
        pa.field("late_before", TIMESTAMP),
    ]
)
# output=counts: partial counts per (window, client, late) and per-task tallies (source.combiner).
COUNTS_ARROW_SCHEMA = pa.schema(
    [
        pa.field("kind", pa.string()),
        pa.field("window_start", TIMESTAMP),
        pa.field("ip", pa.string()),
        pa.field("count", pa.int64()),
        pa.field("event_time", TIMESTAMP),
        pa.field("late", pa.bool_()),
    ]
)
# output=rejects: the records a count leaves out, raw (the first six columns of output=records),
# with the reason.
REJECTS_ARROW_SCHEMA = pa.schema([*list(RECORDS_ARROW_SCHEMA)[:6], pa.field("reason", pa.string())])

# Spark checks each Arrow batch a read task yields against its Arrow form of these: deriving them
# from the Arrow schemas keeps the two equal.
SCHEMA: StructType = from_arrow_schema(RECORDS_ARROW_SCHEMA)
COUNTS_SCHEMA: StructType = from_arrow_schema(COUNTS_ARROW_SCHEMA)
REJECTS_SCHEMA: StructType = from_arrow_schema(REJECTS_ARROW_SCHEMA)


def schema_for(output: str) -> StructType:
    """The Spark schema of one `output` mode (records, counts, rejects)."""
    return {"records": SCHEMA, "counts": COUNTS_SCHEMA, "rejects": REJECTS_SCHEMA}[output]
