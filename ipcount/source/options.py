"""Options of the Kafka source: one table of (Spark option name, field, default, parser) from which
the driver parses them (`parse_options`) and maps settings to them (`source_options`)."""

from __future__ import annotations

import difflib
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from ipcount.config import (
    MAX_BYTES_PER_BATCH,
    MIN_BYTES_PER_BATCH,
    NATIVE_MODES,
    RunMode,
    Settings,
)
from ipcount.errors import ConfigError, SourceError
from ipcount.kafka import SHORT_FETCH_WAIT_MS
from ipcount.kafka.quirks import broker_quirks, quirks_named
from ipcount.source.offsets import TopicPartitionKey, parse_starting_offsets

__all__ = [
    "EVENT_TIME_FORMATS",
    "FLUSH_MODES",
    "OUTPUTS",
    "SourceOptions",
    "parse_options",
    "source_options",
]

# How the driver finds the newest event time for heartbeats: the records' Kafka timestamps, or the
# $time_local of valid nginx combined-format lines (what the ipcount job counts).
EVENT_TIME_FORMATS = ("kafka-timestamp", "nginx-combined")
# Where Trigger.AvailableNow leaves event time at the end: at the newest record ("data": the windows
# the data closed are emitted, later runs lose nothing) or past every window ("all").
FLUSH_MODES = ("data", "all")
# What the read tasks hand to Spark: the raw records (Spark's Kafka source schema), partial counts
# per (window, client, late) of the nginx combined-format lines they read (source.combiner), or
# only the records those counts leave out, with their reason (dead letters).
OUTPUTS = ("records", "counts", "rejects")
# Options that no longer do anything but are still accepted, so a job that sets them keeps
# starting. maxRecordBytes: a record's length never decides whether it counts (issue 28).
_RETIRED = {"maxrecordbytes"}
# Spark Kafka options this source does not implement: fail instead of silently ignoring them.
_UNSUPPORTED = {
    "assign", "subscribepattern", "endingoffsets", "startingtimestamp",
    "startingoffsetsbytimestamp", "startingoffsetsbytimestampstrategy", "endingtimestamp",
    "endingoffsetsbytimestamp", "includeheaders", "minoffsetspertrigger", "maxtriggerdelay",
    "groupidprefix", "fetchoffset.numretries", "fetchoffset.retryintervalms",
}  # fmt: skip
# librdkafka settings the source must own: it tracks offsets itself, in Spark's checkpoint.
_OWNED_KAFKA = {
    "auto.offset.reset": "use the startingOffsets option",
    "enable.auto.commit": "offsets live in Spark's checkpoint, never in a consumer group",
    "enable.auto.offset.store": "offsets live in Spark's checkpoint, never in a consumer group",
    "allow.auto.create.topics": "the source never creates topics; create them first",
}
# Defaults for every consumer the source creates; kafka.* options override them.
_CONSUMER_DEFAULTS = {
    "isolation.level": "read_committed",
    "enable.partition.eof": "false",
    # How far a read task's consumer fetches ahead of what the task has taken. librdkafka cannot
    # stop at a range's end, so whatever its queue holds when the range is done was fetched for
    # nothing (by the broker, librdkafka and the task's CPU): with 1M, a 125k-record range of a
    # longer log cost 3.3-3.6 us/record and twice the broker's CPU, against 1.9-2.3 with 20k.
    # A full queue postpones the next fetch by fetch.queue.backoff.ms (1 s by default), which
    # idled the fetcher in every chunk: 10 ms keeps it ahead of the task (same wall time).
    "queued.min.messages": "20000",
    "fetch.queue.backoff.ms": "10",
}


@dataclass(frozen=True, kw_only=True)
class SourceOptions:
    """Validated source options (see `_OPTIONS` for each one's meaning and default); plain data, so
    the reader stays picklable."""

    topics: tuple[str, ...]
    starting_offsets: str | dict[TopicPartitionKey, int]
    kafka: dict[str, str] = field(repr=False)
    max_offsets_per_trigger: int | None
    min_batch_interval_ms: int
    min_partitions: int | None
    max_records_per_partition: int | None
    min_split_records: int | None
    fail_on_data_loss: bool
    poll_timeout_ms: int
    idle_timeout_ms: int
    heartbeat_max_advance_ms: int
    heartbeat_interval_ms: int
    broker_quirks: str
    event_time_format: str
    max_future_skew_ms: int
    available_now_flush: str
    query_checkpoint: str
    counts_checkpoint: str
    watermark_delay_ms: int
    max_bytes_per_batch: int
    output: str
    window_ms: int
    late_corrections: bool
    clean_range_markers: bool
    native_helpers: str

    @property
    def heartbeats(self) -> bool:
        """Idle heartbeats (and the AvailableNow flush heartbeat) are on."""
        return self.idle_timeout_ms > 0

    @property
    def read_committed(self) -> bool:
        return self.kafka.get("isolation.level", "read_committed") == "read_committed"

    def consumer_conf(self, role: str) -> dict[str, str]:
        """librdkafka consumer settings for 'executor' reads or the 'driver' (metadata, tails)."""
        conf = dict(_CONSUMER_DEFAULTS)
        conf.update(quirks_named(self.broker_quirks).consumer_defaults())
        conf.update(self.kafka)
        conf.setdefault("group.id", f"ipcount-source-{role}-{uuid.uuid4().hex[:12]}")
        conf.setdefault("client.id", f"ipcount-source-{role}")
        conf["enable.auto.commit"] = "false"
        conf["enable.auto.offset.store"] = "false"
        conf["allow.auto.create.topics"] = "false"
        # Executors must notice deleted offsets (data loss); the driver's tail reads move up.
        conf["auto.offset.reset"] = "error" if role == "executor" else "earliest"
        if role == "driver":
            # Its looks at the tails read records that are there: nothing is awaited at the end,
            # and a fetch held there held the next look (whatever the read tasks' setting).
            conf["fetch.wait.max.ms"] = SHORT_FETCH_WAIT_MS
        return conf

    def admin_conf(self) -> dict[str, str]:
        """librdkafka settings for the driver's AdminClient (offset lookups)."""
        consumer_only = {"isolation.level", "receive.message.max.bytes", "enable.partition.eof"}
        conf = {k: v for k, v in self.kafka.items() if k not in consumer_only and k != "group.id"}
        conf.setdefault("client.id", "ipcount-source-admin")
        return conf


Parser = Callable[[str, str], Any]


def _integer(minimum: int) -> Parser:
    def parse(name: str, raw: str) -> int:
        try:
            value = int(raw.strip())
        except ValueError:
            raise ConfigError(f"option {name}={raw!r} must be an integer") from None
        if value < minimum:
            raise ConfigError(f"option {name}={value} must be >= {minimum}")
        return value

    return parse


def _boolean(name: str, raw: str) -> bool:
    value = raw.strip().lower()
    if value not in ("true", "false"):
        raise ConfigError(f"option {name}={raw!r} must be true or false")
    return value == "true"


def _one_of(allowed: tuple[str, ...]) -> Parser:
    def parse(name: str, raw: str) -> str:
        value = raw.strip().lower()
        if value not in allowed:
            raise ConfigError(f"option {name}={raw!r} must be one of {', '.join(allowed)}")
        return value

    return parse


def _text(name: str, raw: str) -> str:
    return raw.strip()


def _topics(name: str, raw: str) -> tuple[str, ...]:
    topics = tuple(t.strip() for t in raw.split(",") if t.strip())
    if not topics:
        raise ConfigError(f"option {name} is required: one or more comma-separated topics")
    if len(set(topics)) != len(topics):
        raise ConfigError(f"option {name}={raw!r} names a topic twice")
    return topics


@dataclass(frozen=True)
class _Option:
    """One source option: its Spark name (case-insensitive), the SourceOptions field it sets, its
    default as option text (None: unset), and the parser that turns the text into the value."""

    name: str
    field: str
    default: str | None
    parse: Parser


# Every option of the source, named like Spark's Kafka source where it has one.
_OPTIONS = (
    # Comma-separated topics to read (required).
    _Option("subscribe", "topics", "", _topics),
    # false: deleted offsets (retention, a re-created topic) are skipped with a warning.
    _Option("failOnDataLoss", "fail_on_data_loss", "true", _boolean),
    # earliest | latest | {"topic":{"0":23,"1":-2}} (-2 earliest, -1 latest), every partition named.
    _Option("startingOffsets", "starting_offsets", "latest", lambda name, raw: raw),
    _Option("output", "output", "records", _one_of(OUTPUTS)),
    _Option("eventTimeFormat", "event_time_format", "kafka-timestamp", _one_of(EVENT_TIME_FORMATS)),
    # Event times more than this ahead of the batch's time are future: not counted, never a
    # heartbeat base (0: no bound).
    _Option("maxFutureSkewMs", "max_future_skew_ms", "0", _integer(0)),
    _Option("maxOffsetsPerTrigger", "max_offsets_per_trigger", None, _integer(1)),
    # New records enter a batch at most once per this many ms (0: at every trigger); the query's
    # trigger may then tick more often, so a batch that only applies the watermark the previous
    # one moved (and emits the windows it closed) runs right away. Never under Trigger.AvailableNow.
    _Option("minBatchIntervalMs", "min_batch_interval_ms", "0", _integer(0)),
    _Option("minPartitions", "min_partitions", None, _integer(1)),
    _Option("maxRecordsPerPartition", "max_records_per_partition", None, _integer(1)),
    # minPartitions splits no partition's range into parts smaller than this many records.
    _Option("minSplitRecords", "min_split_records", None, _integer(1)),
    # A read task fails when its consumer makes no progress for this long.
    _Option("kafkaConsumer.pollTimeoutMs", "poll_timeout_ms", "120000", _integer(1)),
    # Idle heartbeats after this much wall-clock time without records (0: off).
    _Option("idleTimeoutMs", "idle_timeout_ms", "0", _integer(0)),
    # A heartbeat is at most this far past the newest trusted event time...
    _Option("heartbeatMaxAdvanceMs", "heartbeat_max_advance_ms", "60000", _integer(1)),
    # ... and at least this long after the previous heartbeat.
    _Option("heartbeatIntervalMs", "heartbeat_interval_ms", "1000", _integer(0)),
    # Workarounds for noida-db: "noida-db" or "none" (the pipeline asks the broker: kafka.quirks).
    _Option("brokerQuirks", "broker_quirks", "none", lambda name, raw: quirks_named(raw).name),
    _Option("availableNowFlush", "available_now_flush", "data", _one_of(FLUSH_MODES)),
    # The reading query's checkpointLocation: each batch's rows carry the watermark its late
    # records are judged by (column late_before), and its batch time, from its offset log.
    _Option("queryCheckpoint", "query_checkpoint", "", _text),
    # output=rejects: the counting query's checkpointLocation. The dead letters follow its
    # batches, and each record is judged by the batch time of the batch that counted it.
    _Option("countsCheckpoint", "counts_checkpoint", "", _text),
    # The query's watermark delay: availableNowFlush=all closes the window of the newest event
    # time, and no more, by moving event time to that window's end plus this delay.
    _Option("watermarkDelayMs", "watermark_delay_ms", "0", _integer(0)),
    # A read task hands its records to Spark in Arrow batches of at most this many value bytes
    # (or partition_reader.BATCH_ROWS records, whichever comes first).
    _Option(
        "maxBytesPerBatch",
        "max_bytes_per_batch",
        str(MAX_BYTES_PER_BATCH),
        _integer(MIN_BYTES_PER_BATCH),
    ),
    # output=counts|rejects: the tumbling window length (records count at any length).
    _Option("windowMs", "window_ms", "5000", _integer(1)),
    # output=counts: records of already-emitted windows count as corrections (late=true); off,
    # they are left to Spark, which drops them (numRowsDroppedByWatermark).
    _Option("lateCorrections", "late_corrections", "true", _boolean),
    # output=counts: a task that finds no rejects in its range marks it clean under
    # queryCheckpoint (local only), so the dead-letter query (countsCheckpoint) skips that read.
    _Option("cleanRangeMarkers", "clean_range_markers", "false", _boolean),
    _Option("nativeHelpers", "native_helpers", "auto", _one_of(NATIVE_MODES)),
)
_BY_FIELD = {o.field: o for o in _OPTIONS}
_KNOWN = {o.name.lower() for o in _OPTIONS}


def parse_options(options: Mapping[str, Any]) -> SourceOptions:
    """Validate the reader options given to spark.readStream.format("ipcount-kafka").

    Raises:
        ConfigError: naming the option to fix.
    """
    opts = {str(k).lower(): str(v) for k, v in options.items() if v is not None}
    kafka = {k[len("kafka.") :]: v for k, v in opts.items() if k.startswith("kafka.")}
    for key in opts:
        if key.startswith("kafka.") or key in _KNOWN or key in _RETIRED or key == "path":
            continue
        if key in _UNSUPPORTED:
            raise ConfigError(
                f"option {key!r} of Spark's Kafka source is not supported by ipcount-kafka"
            )
        close = difflib.get_close_matches(key, sorted(_KNOWN), n=1)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        raise ConfigError(f"unknown option {key!r} for ipcount-kafka{hint}")
    for key, why in _OWNED_KAFKA.items():
        if key in kafka:
            raise ConfigError(f"option kafka.{key} is not allowed: {why}")
    if not kafka.get("bootstrap.servers"):
        raise ConfigError("option kafka.bootstrap.servers is required (host:port[,host:port...])")
    iso = kafka.get("isolation.level", "read_committed")
    if iso not in ("read_committed", "read_uncommitted"):
        raise ConfigError(
            f"option kafka.isolation.level={iso!r} must be read_committed or read_uncommitted"
        )
    values: dict[str, Any] = {}
    for o in _OPTIONS:
        raw = opts.get(o.name.lower(), o.default)
        values[o.field] = None if raw is None else o.parse(o.name, raw)
    try:
        values["starting_offsets"] = parse_starting_offsets(
            values["starting_offsets"], values["topics"]
        )
    except SourceError as exc:
        raise ConfigError(str(exc)) from None
    output = values["output"]
    if output != "records" and values["event_time_format"] != "nginx-combined":
        raise ConfigError(f"option output={output} needs eventTimeFormat=nginx-combined")
    if output != "records" and values["max_future_skew_ms"] > 0 and not values["query_checkpoint"]:
        raise ConfigError(
            f"option output={output} with maxFutureSkewMs needs option queryCheckpoint (the "
            "query's checkpointLocation): a record's batch time comes from its offset log"
        )
    return SourceOptions(kafka=kafka, **values)


# job.min_partitions = 0 (auto) makes read tasks of at least this many records (source.task_plan):
# below it a task's fixed cost (~60 ms: a Python worker's hand-over) outweighs the gain.
AUTO_MIN_SPLIT_RECORDS = 50_000

# Heartbeats stop once they pass the last event by window + delay + this much: enough for the
# watermark to close every window, not so much that idle triggers run batches for ever.
_HEARTBEAT_SLACK_MS = 1000


def _ms(seconds: float) -> int:
    return int(round(seconds * 1000))


def source_options(
    settings: Settings,
    *,
    output: str = "counts",
    heartbeats: bool = True,
    mode: RunMode = RunMode(),
    query_checkpoint: str = "",
    counts_checkpoint: str = "",
    cores: int = 0,
    batch_interval_ms: int = 0,
) -> dict[str, str]:
    """Options for the `ipcount-kafka` source, from settings (the one place config maps to it).

    `output`: counts (the combiner: partial counts), rejects (dead letters) or records (raw).
    `mode.close_all_windows`: an AvailableNow run ends past every window instead of at its newest
    event time (see `ipcount run --close-all-windows`). `query_checkpoint`: the reading query's
    checkpoint, whose offset log gives each batch's time (future records) and watermark (late
    records). `counts_checkpoint` (output=rejects): the counting query's checkpoint, whose batches
    the dead letters follow, so that both queries give each record one verdict. `cores`: the
    cores Spark runs tasks on; job.min_partitions = 0 (auto) splits a batch into twice as many
    read tasks of the same size, so that every core stays busy to its end however unevenly the
    partitions fill (source.task_plan).
    `batch_interval_ms`: admit new records at most this often (source.pacing; 0: every trigger).
    """
    job = settings.job
    window_ms, delay_ms = _ms(job.window_seconds), _ms(job.watermark_delay_seconds)
    # By SourceOptions field; None leaves the option unset.
    values: dict[str, Any] = {
        "topics": settings.topics.source,
        "output": output,
        "window_ms": window_ms,
        "late_corrections": job.late_corrections,
        "event_time_format": "nginx-combined",
        "max_future_skew_ms": _ms(job.max_future_skew_seconds),
        "available_now_flush": "all" if mode.close_all_windows else "data",
        "watermark_delay_ms": delay_ms,
        "starting_offsets": job.starting_offsets,
        # Rejects: every counting batch since the last run (source.follow bounds it), not a limit.
        "max_offsets_per_trigger": None if output == "rejects" else job.max_offsets_per_trigger,
        "min_batch_interval_ms": batch_interval_ms or None,
        "fail_on_data_loss": job.fail_on_data_loss,
        "max_bytes_per_batch": job.max_bytes_per_batch,
        "min_partitions": job.min_partitions or 2 * cores or None,
        # Auto makes no task smaller than this: a live batch of a few thousand records reads
        # faster in one task (20k records/s: batches 0.39 -> 0.35 s).
        "min_split_records": None if job.min_partitions else AUTO_MIN_SPLIT_RECORDS,
        "max_records_per_partition": job.max_records_per_partition or None,
        "query_checkpoint": query_checkpoint or None,
        "counts_checkpoint": counts_checkpoint or None,
        # Only a dead-letter query uses them.
        "clean_range_markers": output == "counts" and settings.job.dead_letter,
        "native_helpers": job.native_helpers,
    }
    if heartbeats:
        values["idle_timeout_ms"] = _ms(job.idle_timeout_seconds)
        values["heartbeat_max_advance_ms"] = window_ms + delay_ms + _HEARTBEAT_SLACK_MS
    values["broker_quirks"] = broker_quirks(
        settings.kafka.to_librdkafka("admin"),
        settings.kafka.broker_quirks,
        settings.kafka.connect_timeout_seconds,
    ).name
    opts = {
        _BY_FIELD[name].name: _option_text(value)
        for name, value in values.items()
        if value is not None
    }
    for key, value in settings.kafka.to_librdkafka("consumer").items():
        opts[f"kafka.{key}"] = value
    return opts


def _option_text(value: Any) -> str:
    """A value as Spark option text (options are strings; booleans are true/false)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)
