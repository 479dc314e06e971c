"""The `ipcount-kafka-txn` streaming sink's data source: what Spark creates it from, and the
stream writer it hands out (sink.writer).

Spark creates a Python data source in a planner process of its own at every start, importing this
module there: it imports neither the Kafka client nor Avro, which only the writer needs."""

from __future__ import annotations

from typing import TYPE_CHECKING

from pyspark.sql import types as T
from pyspark.sql.datasource import DataSource

if TYPE_CHECKING:
    from ipcount.sink.writer import KafkaTxnStreamWriter

__all__ = ["KafkaTxnDataSource"]


class KafkaTxnDataSource(DataSource):
    """Exactly-once Kafka sink: one transaction per sink task and micro-batch, one more on the
    driver for the query's marker; committed batches are not rewritten.

    Options: topic, progressTopic, queryId (required); lateTopic (counts mode: rows with a true
    `late` column go there, in the same transaction); queryCheckpoint (the query's
    checkpointLocation: markers record each batch's source offsets, commit receipts are kept
    there, and both are checked against each other, see sink.history); transactionalId (default
    ipcount-<queryId>); maxRecordBytes, maxValueBytes (raw mode: every record is bounded to fit,
    see sink.dead_letters),
    transactionTimeoutMs, retryDeadlineSeconds, wireFormat, schemaRegistryUrl, mode
    ('counts' | 'raw'); logLevel, logFormat (the sink's Python workers log at the job's level and
    format: each batch's line of what its tasks wrote, sink.task_commit); kafka.<key> (producer
    and consumer), kafka.producer.<key>, kafka.consumer.<key> (librdkafka settings).
    """

    @classmethod
    def name(cls) -> str:
        return "ipcount-kafka-txn"

    def streamWriter(self, schema: T.StructType, overwrite: bool) -> KafkaTxnStreamWriter:
        from ipcount.sink.writer import KafkaTxnStreamWriter

        return KafkaTxnStreamWriter(self.options, schema)
