"""Options of the Kafka source (parsed on the driver, carried to executors), its client configs."""

from __future__ import annotations

import difflib
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from ipcount.config import Settings
from ipcount.errors import ConfigError, SourceError
from ipcount.kafka.quirks import broker_quirks, quirks_named
from ipcount.source.offsets import TopicPartitionKey, parse_starting_offsets

__all__ = ["SourceOptions", "parse_options", "source_options"]

# Options named like Spark's Kafka source (keys arrive lower-cased from Spark).
_KNOWN = {
    "subscribe",
    "startingoffsets",
    "maxoffsetspertrigger",
    "minpartitions",
    "maxrecordsperpartition",
    "failondataloss",
    "kafkaconsumer.polltimeoutms",
    "idletimeoutms",
    "heartbeatmaxadvancems",
    "heartbeatintervalms",
    "brokerquirks",
    "eventtimeformat",
    "maxfutureskewms",
    "availablenowflush",
    "querycheckpoint",
    "countscheckpoint",
    "watermarkdelayms",
    "maxbytesperbatch",
    "output",
    "windowms",
    "latecorrections",
}
# Options that no longer do anything but are still accepted, so a job that sets them keeps
# starting. maxRecordBytes: a record's length never decides whether it counts (issue 28).
_RETIRED = {"maxrecordbytes"}
# How the driver finds the newest event time for heartbeats: the records' Kafka timestamps, or the
# $time_local of valid nginx combined-format lines (what the ipcount job counts).
EVENT_TIME_FORMATS = ("kafka-timestamp", "nginx-combined")
# Where Trigger.AvailableNow leaves event time at the end: at the newest record ("data": the windows
# the data closed are emitted, later runs lose nothing) or past every window ("all").
FLUSH_MODES = ("data", "all")
# What the read tasks hand to Spark: the raw records (Spark's Kafka source schema), partial counts
# per (window, client, late) of the nginx combined-format lines they read (the combiner, see
# source.combine), or only the records those counts leave out, with their reason (dead letters).
OUTPUTS = ("records", "counts", "rejects")
# Spark Kafka options this source does not implement: fail instead of silently ignoring them.
_UNSUPPORTED = {
    "assign",
    "subscribepattern",
    "endingoffsets",
    "startingtimestamp",
    "startingoffsetsbytimestamp",
    "startingoffsetsbytimestampstrategy",
    "endingtimestamp",
    "endingoffsetsbytimestamp",
    "includeheaders",
    "minoffsetspertrigger",
    "maxtriggerdelay",
    "maxrecordsperpartition",
    "groupidprefix",
    "fetchoffset.numretries",
    "fetchoffset.retryintervalms",
}
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
}


@dataclass(frozen=True)
class SourceOptions:
    """Validated source options; plain data so the reader stays picklable."""

    topics: tuple[str, ...]
    starting_offsets: str | dict[TopicPartitionKey, int]
    kafka: dict[str, str] = field(repr=False)
    max_offsets_per_trigger: int | None = None
    min_partitions: int | None = None
    max_records_per_partition: int | None = None
    fail_on_data_loss: bool = True
    poll_timeout_ms: int = 120_000
    idle_timeout_ms: int = 0
    heartbeat_max_advance_ms: int = 60_000
    heartbeat_interval_ms: int = 1_000
    # BrokerQuirks name: "noida-db" or "none" (the pipeline asks the broker; see kafka.quirks).
    broker_quirks: str = "none"
    event_time_format: str = "kafka-timestamp"
    # Event times more than this ahead of the planning clock never become a heartbeat base (0: no
    # bound).
    max_future_skew_ms: int = 0
    available_now_flush: str = "data"
    # The reading query's checkpointLocation: each batch's rows carry the watermark its late
    # records are judged by (column late_before), read from that checkpoint's offset log.
    query_checkpoint: str = ""
    # output=rejects: the counting query's checkpointLocation. The dead letters follow its
    # batches, and each record is judged by the batch time of the batch that counted it.
    counts_checkpoint: str = ""
    # The query's watermark delay: availableNowFlush=all closes the window of the newest event
    # time, and no more, by moving event time to that window's end plus this delay.
    watermark_delay_ms: int = 0
    # A read task hands its records to Spark in Arrow batches of at most this many value bytes
    # (or BATCH_ROWS records, whichever comes first).
    max_bytes_per_batch: int = 16 * 1024 * 1024
    output: str = "records"
    # output=counts|rejects: the tumbling window length (records count at any length).
    window_ms: int = 5_000
    # output=counts: records of already-emitted windows count as corrections (late=true); off,
    # they are left to Spark, which drops them (numRowsDroppedByWatermark).
    late_corrections: bool = True

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
        # Executors must notice deleted offsets (data loss) instead of silently jumping;
        # the driver's tail reads may start before the log start and just move up.
        conf["auto.offset.reset"] = "error" if role == "executor" else "earliest"
        return conf

    def admin_conf(self) -> dict[str, str]:
        """librdkafka settings for the driver's AdminClient (offset lookups)."""
        consumer_only = {"isolation.level", "receive.message.max.bytes", "enable.partition.eof"}
        conf = {k: v for k, v in self.kafka.items() if k not in consumer_only and k != "group.id"}
        conf.setdefault("client.id", "ipcount-source-admin")
        return conf


def _int(
    options: Mapping[str, str], key: str, name: str, default: int | None, minimum: int
) -> int | None:
    if key not in options:
        return default
    raw = options[key]
    try:
        value = int(str(raw).strip())
    except ValueError:
        raise ConfigError(f"option {name}={raw!r} must be an integer") from None
    if value < minimum:
        raise ConfigError(f"option {name}={value} must be >= {minimum}")
    return value


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
    topics = tuple(t.strip() for t in opts.get("subscribe", "").split(",") if t.strip())
    if not topics:
        raise ConfigError("option subscribe is required: one or more comma-separated topics")
    if len(set(topics)) != len(topics):
        raise ConfigError(f"option subscribe={opts['subscribe']!r} names a topic twice")
    iso = kafka.get("isolation.level", "read_committed")
    if iso not in ("read_committed", "read_uncommitted"):
        raise ConfigError(
            f"option kafka.isolation.level={iso!r} must be read_committed or read_uncommitted"
        )
    fail = opts.get("failondataloss", "true").strip().lower()
    if fail not in ("true", "false"):
        raise ConfigError(f"option failOnDataLoss={opts['failondataloss']!r} must be true or false")
    try:
        starting = parse_starting_offsets(opts.get("startingoffsets", "latest"), topics)
    except SourceError as exc:
        raise ConfigError(str(exc)) from None
    output = _choice(opts, "output", "output", OUTPUTS)
    event_format = _choice(opts, "eventtimeformat", "eventTimeFormat", EVENT_TIME_FORMATS)
    skew = _int(opts, "maxfutureskewms", "maxFutureSkewMs", 0, 0) or 0
    if output != "records" and event_format != "nginx-combined":
        raise ConfigError(f"option output={output} needs eventTimeFormat=nginx-combined")
    if output != "records" and skew > 0:
        if not opts.get("querycheckpoint", "").strip():
            raise ConfigError(
                f"option output={output} with maxFutureSkewMs needs option queryCheckpoint (the "
                "query's checkpointLocation): a record's batch time comes from its offset log"
            )
    return SourceOptions(
        topics=topics,
        starting_offsets=starting,
        kafka=kafka,
        max_offsets_per_trigger=_int(opts, "maxoffsetspertrigger", "maxOffsetsPerTrigger", None, 1),
        min_partitions=_int(opts, "minpartitions", "minPartitions", None, 1),
        max_records_per_partition=_int(
            opts, "maxrecordsperpartition", "maxRecordsPerPartition", None, 1
        ),
        fail_on_data_loss=fail == "true",
        poll_timeout_ms=_int(
            opts, "kafkaconsumer.polltimeoutms", "kafkaConsumer.pollTimeoutMs", 120_000, 1
        )
        or 120_000,
        idle_timeout_ms=_int(opts, "idletimeoutms", "idleTimeoutMs", 0, 0) or 0,
        heartbeat_max_advance_ms=_int(
            opts, "heartbeatmaxadvancems", "heartbeatMaxAdvanceMs", 60_000, 1
        )
        or 60_000,
        heartbeat_interval_ms=_int(opts, "heartbeatintervalms", "heartbeatIntervalMs", 1_000, 0)
        or 0,
        broker_quirks=quirks_named(opts.get("brokerquirks", "none")).name,
        event_time_format=event_format,
        max_future_skew_ms=skew,
        available_now_flush=_choice(opts, "availablenowflush", "availableNowFlush", FLUSH_MODES),
        query_checkpoint=opts.get("querycheckpoint", "").strip(),
        counts_checkpoint=opts.get("countscheckpoint", "").strip(),
        watermark_delay_ms=_int(opts, "watermarkdelayms", "watermarkDelayMs", 0, 0) or 0,
        max_bytes_per_batch=_int(
            opts, "maxbytesperbatch", "maxBytesPerBatch", 16 * 1024 * 1024, 1024
        )
        or 16 * 1024 * 1024,
        output=output,
        window_ms=_int(opts, "windowms", "windowMs", 5_000, 1) or 5_000,
        late_corrections=_bool(opts, "latecorrections", "lateCorrections", True),
    )


def _bool(options: Mapping[str, str], key: str, name: str, default: bool) -> bool:
    value = options.get(key, "true" if default else "false").strip().lower()
    if value not in ("true", "false"):
        raise ConfigError(f"option {name}={options[key]!r} must be true or false")
    return value == "true"


def _choice(options: Mapping[str, str], key: str, name: str, allowed: tuple[str, ...]) -> str:
    value = options.get(key, allowed[0]).strip().lower()
    if value not in allowed:
        raise ConfigError(f"option {name}={options[key]!r} must be one of {', '.join(allowed)}")
    return value


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
    close_all_windows: bool = False,
    query_checkpoint: str = "",
    counts_checkpoint: str = "",
) -> dict[str, str]:
    """Options for the `ipcount-kafka` source, from settings (the one place config maps to it).

    `output`: counts (the combiner: partial counts), rejects (dead letters) or records (raw).
    `close_all_windows`: an AvailableNow run ends past every window instead of at its newest event
    time (see `ipcount run --close-all-windows`). `query_checkpoint`: the reading query's
    checkpoint, whose offset log gives each batch's time (future records) and watermark (late
    records). `counts_checkpoint` (output=rejects): the counting query's checkpoint, whose batches
    the dead letters follow, so that both queries give each record one verdict.
    """
    job = settings.job
    opts = {
        "subscribe": settings.topics.source,
        "output": output,
        "windowMs": str(_ms(job.window_seconds)),
        "lateCorrections": "true" if job.late_corrections else "false",
        "eventTimeFormat": "nginx-combined",
        "maxFutureSkewMs": str(_ms(job.max_future_skew_seconds)),
        "availableNowFlush": "all" if close_all_windows else "data",
        "watermarkDelayMs": str(_ms(job.watermark_delay_seconds)),
        "startingOffsets": job.starting_offsets,
        "maxOffsetsPerTrigger": str(job.max_offsets_per_trigger),
        "failOnDataLoss": "true" if job.fail_on_data_loss else "false",
        "maxBytesPerBatch": str(job.max_bytes_per_batch),
    }
    if job.min_partitions:
        opts["minPartitions"] = str(job.min_partitions)
    if job.max_records_per_partition:
        opts["maxRecordsPerPartition"] = str(job.max_records_per_partition)
    if query_checkpoint:
        opts["queryCheckpoint"] = query_checkpoint
    if counts_checkpoint:
        opts["countsCheckpoint"] = counts_checkpoint
    if heartbeats:
        opts["idleTimeoutMs"] = str(_ms(job.idle_timeout_seconds))
        opts["heartbeatMaxAdvanceMs"] = str(
            _ms(job.window_seconds) + _ms(job.watermark_delay_seconds) + _HEARTBEAT_SLACK_MS
        )
    for key, value in settings.kafka.to_librdkafka("consumer").items():
        opts[f"kafka.{key}"] = value
    opts["brokerQuirks"] = broker_quirks(
        settings.kafka.to_librdkafka("admin"),
        settings.kafka.broker_quirks,
        settings.kafka.connect_timeout_seconds,
    ).name
    return opts
