"""The `ipcount-kafka` streaming source's data source: what Spark creates it from (its name and
schema) and the stream reader it hands out (source.reader: the driver plans micro-batches from
Kafka offsets, executors read them).

Spark creates a Python data source in a planner process of its own at every start, importing this
module there: it imports neither the Kafka client nor Arrow, which only the reader needs
(~0.17 CPU-s of that process, on the driver's critical path before the first batch)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from pyspark.sql.datasource import DataSource
from pyspark.sql.types import StructType

from ipcount.errors import SourceError
from ipcount.source.options import parse_options
from ipcount.source.schema import schema_for

if TYPE_CHECKING:
    from ipcount.source.reader import KafkaStreamReader

__all__ = ["KafkaDataSource"]


class KafkaDataSource(DataSource):
    """The `ipcount-kafka` streaming source. Its options, with their defaults, are the table in
    source.options (`_OPTIONS`); kafka.* go to librdkafka (kafka.bootstrap.servers required,
    kafka.isolation.level defaults to read_committed). Lag per partition is reported through
    reportLatestOffset (the Python API has no source-metrics hook).

    Option `output` chooses what the read tasks hand Spark (schemas in source.schema):
    - `records` (default): the raw records, like Spark's Kafka source plus `heartbeat` and
      `late_before`;
    - `counts`: the combiner (source.combiner): the tasks parse the nginx combined-format lines
      they read and pre-aggregate them, one row per (window, client IP, late) with its count and
      newest event time, plus per-task tallies of malformed and future records; heartbeats as
      rows of their own;
    - `rejects`: only the records `counts` leaves out (malformed, future), raw, with their reason.
    `counts` and `rejects` take windowMs, maxFutureSkewMs (judged against the batch's time from
    the queryCheckpoint's offset log, so it is required with a skew bound) and lateCorrections
    (records of windows ending by the batch's late_before are late).

    A heartbeat row (heartbeat=true; key/value null; partition, offset and timestampType -1)
    carries only an event time in `timestamp`, so a watermark can advance when input stops. With
    idleTimeoutMs > 0, once the source is caught up and no record arrived for idleTimeoutMs, each
    trigger may end its batch with one heartbeat at (newest trusted event time + idle wall-clock
    time), at most heartbeatMaxAdvanceMs past that event time and at least heartbeatIntervalMs
    after the previous heartbeat. The newest trusted event time comes from the last records read
    (eventTimeFormat: their Kafka timestamps, or the $time_local of valid nginx lines), never more
    than maxFutureSkewMs ahead of the planning clock. Trigger.AvailableNow ends with two flush
    heartbeats (the first rides on the batch that reads the last records, the second is a batch
    of its own): availableNowFlush=data puts them at that newest event time, so Spark emits the
    windows the data closed and the checkpoint's watermark stays where the data put it; =all waits
    for the data batches, then puts them at the end of the newest counted event's window plus
    watermarkDelayMs (from the queryCheckpoint's commit log), closing exactly the windows that
    hold data. Real records stop heartbeats. Heartbeats live in the offset: a replayed batch
    yields the same rows.

    With option countsCheckpoint (output=rejects: the dead-letter query), the reader follows that
    counting query's offset log: it reads only what that query has planned and judges each record
    by that query's batch time for it (kept in its own offsets). With option queryCheckpoint (the
    reading query's checkpointLocation), every row's late_before is the watermark Spark judges
    this batch's late rows by (the previous batch's, from the offset log; see
    checkpoint.offset_log); without it, null.
    """

    @classmethod
    def name(cls) -> str:
        return "ipcount-kafka"

    def schema(self) -> StructType:
        return schema_for(parse_options(self.options).output)

    def streamReader(self, schema: StructType) -> KafkaStreamReader:
        options = parse_options(self.options)
        if schema != schema_for(options.output):
            raise SourceError(
                f"ipcount-kafka (output={options.output}) has a fixed schema; do not pass "
                f".schema(...) (got {schema.simpleString()})"
            )
        from ipcount.source.reader import KafkaStreamReader

        return KafkaStreamReader(options)
