"""The Spark schemas of the `ipcount-kafka` source, one per `output` option. This module imports no
Arrow: Spark's planner process that creates the source asks for its schema, and importing PyArrow
there would cost every start ~0.07 CPU-s on the driver's critical path (source.arrow_schema holds
the Arrow forms the read tasks yield)."""

from __future__ import annotations

from pyspark.sql.types import (
    BinaryType,
    BooleanType,
    IntegerType,
    LongType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

__all__ = ["SCHEMA", "COUNTS_SCHEMA", "REJECTS_SCHEMA", "schema_for"]

# output=records: Spark's Kafka source schema plus `heartbeat` and `late_before`.
SCHEMA = StructType(
    [
        StructField("key", BinaryType()),
        StructField("value", BinaryType()),
        StructField("topic", StringType()),
        StructField("partition", IntegerType()),
        StructField("offset", LongType()),
        StructField("timestamp", TimestampType()),
        StructField("timestampType", IntegerType()),
        StructField("heartbeat", BooleanType()),
        StructField("late_before", TimestampType()),
    ]
)
# output=counts: partial counts per (window, client, late) and per-task tallies (source.combiner).
COUNTS_SCHEMA = StructType(
    [
        StructField("kind", StringType()),
        StructField("window_start", TimestampType()),
        StructField("ip", StringType()),
        StructField("count", LongType()),
        StructField("event_time", TimestampType()),
        StructField("late", BooleanType()),
    ]
)
# output=rejects: the records a count leaves out, raw (the first six columns of output=records),
# with the reason.
REJECTS_SCHEMA = StructType([*SCHEMA.fields[:6], StructField("reason", StringType())])


def schema_for(output: str) -> StructType:
    """The Spark schema of one `output` mode (records, counts, rejects)."""
    return {"records": SCHEMA, "counts": COUNTS_SCHEMA, "rejects": REJECTS_SCHEMA}[output]
