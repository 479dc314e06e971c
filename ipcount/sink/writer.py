"""The `ipcount-kafka-txn` streaming sink: each sink task encodes its rows and commits them in a
Kafka transaction of its own with its partition's progress marker (sink.task_commit); the driver's
commit() records the batch in the query's marker from the counts the tasks report."""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator, Mapping
from dataclasses import replace
from typing import Any

from pyspark.sql import types as T
from pyspark.sql.datasource import DataSourceStreamArrowWriter, WriterCommitMessage

from ipcount import logsetup
from ipcount.config import Settings, SinkSettings
from ipcount.errors import ConfigError, SinkError
from ipcount.formats.avro import KEY_FIELD, RECORD_FIELDS, WIRE_FORMATS, make_codec
from ipcount.sink.columns import bytes_column, check_schema, millis
from ipcount.sink.dead_letters import DeadLetterLimits, bound_record, message_max_bytes
from ipcount.sink.producer_config import Record, TxnConfig, default_transactional_id, new_run_id
from ipcount.sink.sessions import abort_open_transaction, session_for
from ipcount.sink.task_commit import commit_task, written_by
from ipcount.worker_gc import freeze_long_lived

__all__ = ["KafkaTxnStreamWriter", "sink_options"]

logger = logging.getLogger(__name__)

# The sink's options, by their Spark names: `sink_options` writes them, the writer reads them.
TOPIC, PROGRESS_TOPIC, LATE_TOPIC = "topic", "progressTopic", "lateTopic"
QUERY_ID, RUN_ID, TRANSACTIONAL_ID = "queryId", "runId", "transactionalId"
MODE, WIRE_FORMAT, SCHEMA_REGISTRY_URL = "mode", "wireFormat", "schemaRegistryUrl"
TRANSACTION_TIMEOUT_MS, RETRY_DEADLINE_SECONDS = "transactionTimeoutMs", "retryDeadlineSeconds"
QUERY_CHECKPOINT = "queryCheckpoint"
MAX_RECORD_BYTES, MAX_VALUE_BYTES = "maxRecordBytes", "maxValueBytes"
# The job's log level and format (logsetup.current): the sink's Python workers log at them.
LOG_LEVEL, LOG_FORMAT = "logLevel", "logFormat"

# The Spark types a counts-mode column may have, by the Avro type of its IpCount field.
_SPARK_TYPES: dict[str, tuple[type[T.DataType], ...]] = {
    "timestamp-millis": (T.TimestampType,),
    "string": (T.StringType,),
    "long": (T.LongType, T.IntegerType),
}
_COUNTS_COLUMNS = {name: _SPARK_TYPES[kind] for name, kind in RECORD_FIELDS.items()}
# Counts mode may mark rows as late-count corrections: they go to option lateTopic.
_COUNTS_OPTIONAL: dict[str, tuple[type[T.DataType], ...]] = {"late": (T.BooleanType,)}
_RAW_COLUMNS: dict[str, tuple[type[T.DataType], ...]] = {
    "key": (T.BinaryType, T.StringType),
    "value": (T.BinaryType, T.StringType),
}
# Raw mode may carry why a record is there and where it came from (the dead letters): each
# becomes a Kafka header. What was cut to fit is said by headers of sink.dead_letters.
_RAW_OPTIONAL: dict[str, tuple[type[T.DataType], ...]] = {
    "reason": (T.StringType,),
    "source": (T.StringType,),
}
REASON_HEADER = "ipcount.reason"
HEADERS = {"reason": REASON_HEADER, "source": "ipcount.source"}


def sink_options(
    settings: Settings,
    query_id: str,
    *,
    topic: str | None = None,
    mode: str = "counts",
    run_id: str | None = None,
    late_topic: str | None = None,
    checkpoint: str | None = None,
    max_record_bytes: int | None = None,
    max_value_bytes: int | None = None,
) -> dict[str, str]:
    """The writeStream options for this sink from ipcount settings (the one place they are mapped).

    Args:
        settings: ipcount settings ([kafka], [topics], [sink]).
        query_id: the query's stable id (derived from its checkpoint).
        topic: the output topic; default topics.sink.
        mode: 'counts' (Avro IpCount) or 'raw' (key/value bytes as they are, e.g. the dead letters).
        run_id: identifies this start of the job (default: a new one, see `new_run_id`).
        late_topic: where rows with late=true (corrections) go, in the same transaction.
        checkpoint: the query's checkpointLocation, for the sink's history checks and receipts.
        max_record_bytes: raw mode: the largest record to write (default the producer's
            message.max.bytes); max_value_bytes: raw mode: longer values are cut to it.
    """
    k, s = settings.kafka, settings.sink
    opts = {
        TOPIC: topic or settings.topics.sink,
        PROGRESS_TOPIC: settings.topics.progress,
        QUERY_ID: query_id,
        RUN_ID: run_id or new_run_id(),
        MODE: mode,
        TRANSACTION_TIMEOUT_MS: str(s.transaction_timeout_ms),
        RETRY_DEADLINE_SECONDS: str(s.retry_deadline_seconds),
        WIRE_FORMAT: s.wire_format,
        SCHEMA_REGISTRY_URL: s.schema_registry_url,
        "kafka.bootstrap.servers": k.bootstrap_servers,
    }
    opts[LOG_LEVEL], opts[LOG_FORMAT] = logsetup.current()
    if late_topic:
        opts[LATE_TOPIC] = late_topic
    if checkpoint:
        opts[QUERY_CHECKPOINT] = checkpoint
    if max_record_bytes is not None:
        opts[MAX_RECORD_BYTES] = str(max_record_bytes)
    if max_value_bytes is not None:
        opts[MAX_VALUE_BYTES] = str(max_value_bytes)
    opts.update({f"kafka.{key}": value for key, value in k.common().items()})
    opts.update({f"kafka.producer.{key}": value for key, value in k.producer.items()})
    opts.update({f"kafka.consumer.{key}": value for key, value in k.consumer.items()})
    return opts


class KafkaTxnStreamWriter(DataSourceStreamArrowWriter):
    """Each sink task commits its share in its own transaction; the driver records the batch."""

    # The sink's defaults are the settings' (config.SinkSettings).
    DEFAULT_TRANSACTION_TIMEOUT_MS = SinkSettings.transaction_timeout_ms
    DEFAULT_RETRY_DEADLINE_SECONDS = SinkSettings.retry_deadline_seconds
    DEFAULT_WIRE_FORMAT = SinkSettings.wire_format
    DEFAULT_MODE = "counts"
    MODES = ("counts", "raw")

    def __init__(self, options: Mapping[str, str], schema: T.StructType) -> None:
        opts = {str(k).lower(): str(v) for k, v in options.items()}

        def get(name: str, default: str = "") -> str:
            return opts.get(name.lower(), default)

        def required(name: str) -> str:
            value = get(name).strip()
            if not value:
                raise ConfigError(f"ipcount-kafka-txn sink: option {name!r} is required")
            return value

        self.mode = get(MODE, self.DEFAULT_MODE)
        if self.mode not in self.MODES:
            raise ConfigError(
                f"ipcount-kafka-txn sink: option 'mode' must be one of {self.MODES}, "
                f"got {self.mode!r}"
            )
        self.wire_format = get(WIRE_FORMAT, self.DEFAULT_WIRE_FORMAT)
        if self.wire_format not in WIRE_FORMATS:
            raise ConfigError(
                f"ipcount-kafka-txn sink: option 'wireFormat' (sink.wire_format) must be one of "
                f"{', '.join(WIRE_FORMATS)}, got {self.wire_format!r}"
            )
        self.schema_registry_url = get(SCHEMA_REGISTRY_URL)
        self.log = (get(LOG_LEVEL, "INFO"), get(LOG_FORMAT, "text"))
        if self.wire_format == "confluent" and not self.schema_registry_url:
            raise ConfigError(
                "sink.schema_registry_url (option 'schemaRegistryUrl') must be set for "
                "wireFormat 'confluent'"
            )
        common, producer, consumer = {}, {}, {}
        for key, value in opts.items():
            if key.startswith("kafka.producer."):
                producer[key[len("kafka.producer.") :]] = value
            elif key.startswith("kafka.consumer."):
                consumer[key[len("kafka.consumer.") :]] = value
            elif key.startswith("kafka."):
                common[key[len("kafka.") :]] = value
        query_id = required(QUERY_ID)
        # The tasks' config (each adds its sink partition, see sink.task_commit); the chaos tests'
        # fault points strike in the counting query's task transactions, which hold the results.
        self.task_config = TxnConfig(
            topic=required(TOPIC),
            progress_topic=required(PROGRESS_TOPIC),
            query_id=query_id,
            run_id=get(RUN_ID),
            transactional_id=get(TRANSACTIONAL_ID) or default_transactional_id(query_id),
            fault_points=self.mode == "counts",
            producer_conf={**common, **producer},
            consumer_conf={**common, **consumer},
            transaction_timeout_ms=_number(
                opts, TRANSACTION_TIMEOUT_MS, int, self.DEFAULT_TRANSACTION_TIMEOUT_MS
            ),
            retry_deadline_seconds=_number(
                opts, RETRY_DEADLINE_SECONDS, float, self.DEFAULT_RETRY_DEADLINE_SECONDS
            ),
            late_topic=get(LATE_TOPIC).strip(),
            checkpoint=get(QUERY_CHECKPOINT).strip(),
        )
        # The driver's: its transaction holds the query's marker only.
        self.config = replace(self.task_config, fault_points=False)
        self.columns = check_schema(
            schema,
            _COUNTS_COLUMNS if self.mode == "counts" else _RAW_COLUMNS,
            self.mode,
            _COUNTS_OPTIONAL if self.mode == "counts" else _RAW_OPTIONAL,
        )
        self.limits = (
            DeadLetterLimits(
                _number(opts, MAX_RECORD_BYTES, int, None)
                or message_max_bytes(self.config.producer_conf),
                _number(opts, MAX_VALUE_BYTES, int, None),
            )
            if self.mode == "raw"
            else None
        )
        if "late" in self.columns and not self.config.late_topic:
            raise ConfigError(
                "ipcount-kafka-txn sink: the input has a 'late' column (corrections) but option "
                "'lateTopic' (topics.late) is not set"
            )

    def write(self, iterator: Iterator[Any]) -> WriterCommitMessage:
        """Encode this task's rows (Arrow record batches) and commit them in this task's own
        transaction (sink.task_commit). Runs on the executor."""
        from pyspark import TaskContext

        freeze_long_lived()
        logsetup.configure_worker(*self.log)
        ctx = TaskContext.get()
        if ctx is None:
            raise SinkError("ipcount-kafka-txn sink: write() ran outside a Spark task")
        records: list[Record] = []
        started = time.perf_counter()
        self._encode(iterator, records)
        encoded = time.perf_counter() - started
        return commit_task(self.task_config, ctx, records, encode_seconds=encoded)

    def _encode(self, iterator: Iterator[Any], records: list[Record]) -> None:
        """Every row of the task, encoded into `records` (the whole iterator is consumed: the
        state store commits its version when the rows are all read)."""
        if self.limits is not None:
            self._write_raw(iterator, records, self.limits)
            return
        codec = make_codec(self.wire_format, self.schema_registry_url, self.config.topic)
        late_topic = self.config.late_topic
        late_codec = (
            make_codec(self.wire_format, self.schema_registry_url, late_topic)
            if "late" in self.columns
            else codec
        )
        names = list(RECORD_FIELDS)
        for batch in iterator:
            columns = [
                millis(batch, name)
                if kind == "timestamp-millis"
                else batch.column(name).to_pylist()
                for name, kind in RECORD_FIELDS.items()
            ]
            lates = (
                batch.column("late").to_pylist()
                if "late" in self.columns
                else [False] * batch.num_rows
            )
            for values, late in zip(zip(*columns, strict=True), lates, strict=True):
                row = dict(zip(names, values, strict=True))
                # The value first: the codec names a field that is wrong (e.g. a null ip).
                if late:
                    value = late_codec.encode(row)
                    records.append((row[KEY_FIELD].encode("utf-8"), value, None, late_topic))
                else:
                    value = codec.encode(row)
                    records.append((row[KEY_FIELD].encode("utf-8"), value))

    def _write_raw(
        self, iterator: Iterator[Any], records: list[Record], limits: DeadLetterLimits
    ) -> None:
        """Raw mode: each record as it is, its header columns as headers, bounded so it fits
        whatever it holds (a record that cannot be produced would fail every replay)."""
        named = [c for c in HEADERS if c in self.columns]
        for batch in iterator:
            keys = bytes_column(batch.column("key"))
            values = bytes_column(batch.column("value"))
            columns = [batch.column(c).to_pylist() for c in named]
            for key, value, *row in zip(keys, values, *columns, strict=True):
                headers = [
                    (HEADERS[c], str(v).encode()) for c, v in zip(named, row) if v is not None
                ]
                record = bound_record(key, value, headers, limits)
                records.append((record.key, record.value, record.headers or None))  # type: ignore[arg-type]

    def commit(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        """Record the batch in the query's marker, counting what the tasks committed (its
        transaction holds the marker only: no result passes through the driver)."""
        logsetup.configure_worker(*self.log)
        written = written_by(batchId, messages)
        session_for(self.config).commit_batch(batchId, [], written=written)

    def abort(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        """The batch failed: a write task failed, or commit() raised. Runs on the driver.

        Each task's transaction is committed or aborted by the task itself (commit_batch aborts
        before raising); a task that died inside one leaves it open until the retried task's
        init_transactions (same transactional.id) aborts it. Tasks that committed stay committed:
        their markers make the replay of the batch skip them. Spark fails the batch; a restart
        replays it from its offsets.
        """
        failed = sum(1 for m in messages if m is None)
        logger.warning(
            "batch %d was not committed to %s (%d of %d write tasks failed; otherwise the commit "
            "failed): shares its tasks committed stay visible and the replay skips them; the "
            "rest is not visible to read_committed readers",
            batchId,
            self.config.topic,
            failed,
            len(messages),
        )
        # Defensive: commit_batch never leaves a transaction open, but if one is, end it now.
        abort_open_transaction(self.config.transactional_id, batchId)


def _number(opts: Mapping[str, str], name: str, kind: type, default: Any) -> Any:
    raw = opts.get(name.lower())
    if raw is None or raw == "":
        return default
    try:
        return kind(raw)
    except ValueError:
        raise ConfigError(
            f"ipcount-kafka-txn sink: option {name!r} must be a number, got {raw!r}"
        ) from None
