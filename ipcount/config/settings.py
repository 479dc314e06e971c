"""ipcount's settings: one frozen dataclass per section and their validation."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from ipcount.config.kafka_settings import KafkaSettings
from ipcount.errors import ConfigError

__all__ = [
    "KafkaSettings",
    "TopicSettings",
    "JobSettings",
    "SinkSettings",
    "BrokerSettings",
    "HttpSettings",
    "SparkSettings",
    "MetricsSettings",
    "Settings",
    "SECTIONS",
    "PASSTHROUGH",
    "MAX_BYTES_PER_BATCH",
    "MIN_BYTES_PER_BATCH",
    "MAX_RECORD_BYTES",
    "WIRE_FORMATS",
    "NATIVE_MODES",
    "MIN_TRANSACTION_TIMEOUT_MS",
    "validate",
]

# A read task hands records to Spark in Arrow batches of at most this many value bytes (default of
# job.max_bytes_per_batch and of the source's option maxBytesPerBatch), and at least the minimum.
MAX_BYTES_PER_BATCH = 16 * 1024 * 1024
MIN_BYTES_PER_BATCH = 1024
# The retired job.max_record_bytes's default (nginx's 8 KiB header buffer); loadgen still sizes
# its oversized lines by it.
MAX_RECORD_BYTES = 8192
# The sink's wire formats (sink.wire_format): Avro single-object encoding or Confluent's framing.
WIRE_FORMATS = ("single-object", "confluent")
# Whether the read tasks use their compiled helpers (job.native_helpers: ipcount.source._fastread
# reads values, ipcount.formats._prefix_scan checks lines, cuts clients and times): where built
# (auto), always (on: a job fails at start where one is not), or never (off: confluent-kafka's
# Message objects and Arrow's kernels).
NATIVE_MODES = ("auto", "on", "off")
# The shortest transaction timeout the sink takes (sink.transaction_timeout_ms).
MIN_TRANSACTION_TIMEOUT_MS = 1000


@dataclass(frozen=True)
class TopicSettings:
    """Topic names and how `ipcount topics create` makes them."""

    source: str = "ip_count_source"
    sink: str = "ip_count_sink"
    progress: str = "ip_count_sink_progress"
    late: str = "ip_count_late"
    dead_letter: str = "ip_count_dead_letter"
    source_partitions: int = 3
    sink_partitions: int = 3
    # 0: as many replicas as the cluster has brokers, at most 3 (read by `ipcount topics create`).
    replication_factor: int = 0
    # -1 keeps records forever, so historical event times (backfills, benchmarks) survive.
    source_retention_ms: int = -1


@dataclass(frozen=True)
class JobSettings:
    """The streaming job: windows, watermark, idleness, triggers and bad-record handling."""

    window_seconds: float = 5.0
    watermark_delay_seconds: float = 5.0
    idle_timeout_seconds: float = 2.0
    trigger_interval_seconds: float = 1.0
    checkpoint_location: str = ".ipcount/checkpoints/ipcount"
    starting_offsets: str = "earliest"
    max_offsets_per_trigger: int = 10_000_000
    min_partitions: int = 0
    max_records_per_partition: int = 0
    fail_on_data_loss: bool = True
    # Retired: a record's length never decides whether it counts (every line nginx writes is
    # counted, whatever its length). Still accepted so existing configs load; no effect.
    max_record_bytes: int = MAX_RECORD_BYTES
    # Records stamped more than this ahead of their micro-batch's time (kept in the checkpoint)
    # are not counted and do not move the watermark: a bad clock must not make later records late.
    max_future_skew_seconds: float = 300.0
    # Write malformed and future records, raw, to topics.dead_letter (a second, stateless query):
    # on by default, so nothing rejected is thrown away silently.
    dead_letter: bool = True
    # How often the dead-letter query runs (processing time; AvailableNow runs are unaffected).
    # It follows every counting batch whatever its pace, several at once: dead letters are for
    # inspection, not latency, and each run costs tasks on the counting query's cores.
    dead_letter_interval_seconds: float = 10.0
    # Dead letters longer than this are truncated to it (headers keep the original size and the
    # source coordinates), so any record the source holds can be dead-lettered. 256 KiB holds the
    # longest line nginx writes with its default buffers whole: 1 KiB + 4 x 8 KiB of client
    # bytes (client_header_buffer_size, large_client_header_buffers) escaped 4x as \xHH = 132 KiB.
    dead_letter_max_bytes: int = 262144
    # A read task hands records to Spark in Arrow batches of at most this many value bytes.
    max_bytes_per_batch: int = MAX_BYTES_PER_BATCH
    # Records that arrive after their window's result was emitted are written to topics.late as
    # corrections (same transaction as the batch). Needs the checkpoint readable from Python
    # (local/shared file system, or s3://, gs://, hdfs:// through pyarrow). false: Spark drops them.
    late_corrections: bool = True
    # Read tasks copy record values from librdkafka straight into Arrow buffers and cut clients and
    # times out of the lines with the compiled helpers that pip builds where a C compiler is
    # found: auto (where built), on (fail at start where one is not), off (confluent-kafka's
    # Message objects and Arrow's kernels; the same counts, more CPU per record).
    native_helpers: str = "auto"
    # Restart strategy (Flink's failure-rate): a failed query is restarted in the driver, this long
    # apart, up to restart_attempts times within restart_window_seconds (0: the job's whole life).
    # Fatal failures (fenced, config, sink history, data loss with failOnDataLoss) stop at once.
    restart_attempts: int = 3
    restart_delay_seconds: float = 10.0
    restart_window_seconds: float = 600.0


@dataclass(frozen=True)
class SinkSettings:
    """The transactional Avro sink; these defaults are the sink options' too (sink.writer)."""

    # Must not exceed the broker's transaction.max.timeout.ms (checked at start-up).
    transaction_timeout_ms: int = 60_000
    # 'single-object' (Avro single-object encoding) or 'confluent' (needs schema_registry_url).
    wire_format: str = "single-object"
    schema_registry_url: str = ""
    # How long a retriable Kafka error is retried before the batch fails.
    retry_deadline_seconds: float = 60.0


@dataclass(frozen=True)
class BrokerSettings:
    """The local broker that `ipcount broker` runs for development, the demo and the tests."""

    # "kafka" (Apache Kafka in KRaft mode, from Maven Central) or "noida-db" (embedded, from pip).
    kind: str = "kafka"
    host: str = "127.0.0.1"
    port: int = 9092
    data_dir: str = ".ipcount/broker"
    start_timeout_seconds: float = 30.0
    # Apache Kafka only: its version (Maven Central) and transaction.max.timeout.ms.
    kafka_version: str = "4.4.0"
    transaction_max_timeout_ms: int = 900_000


@dataclass(frozen=True)
class SparkSettings:
    """The Spark session: master, parallelism, state store, and free-form `spark.*` settings."""

    master: str = "local[*]"
    app_name: str = "ipcount"
    # Fixed in the checkpoint at first start; about one per executor core (see conf/ipcount.toml).
    shuffle_partitions: int = 2
    # 'rocksdb' or 'hdfs' (Spark's default in-memory/HDFS-backed provider).
    state_store: str = "rocksdb"
    driver_memory: str = "2g"
    # The driver JVM ipcount launches maps Spark's classes from a class-data-sharing archive,
    # written by the first run that exits normally (see conf/ipcount.toml).
    jvm_class_archive: bool = True
    conf: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class MetricsSettings:
    """The driver's Prometheus /metrics and /healthz endpoint (`ipcount run --metrics-port`)."""

    # 0 = off. The endpoint serves /metrics (Prometheus text) and /healthz.
    port: int = 0
    # Loopback by default: nothing is exposed unless asked; containers need 0.0.0.0.
    host: str = "127.0.0.1"
    # /healthz answers 503 after this many trigger intervals without a finished micro-batch while
    # records wait in the source (lag > 0). Idle with nothing waiting is healthy.
    stall_triggers: int = 120
    # How often the driver asks the brokers for the source's stable end offsets (one ListOffsets
    # call, off the micro-batch path) to refresh ipcount_source_lag_records.
    lag_poll_seconds: float = 5.0


@dataclass(frozen=True)
class HttpSettings:
    """Limits of ipcount's HTTP endpoints: the job's /metrics and /healthz, `ipcount dashboard`."""

    # A client has this long from connecting to send its whole request head; the connection is
    # then closed. Also the bound on writing one response to a client that does not read.
    request_timeout_seconds: float = 5.0
    # Connections held at once per endpoint. A new one beyond it closes the oldest that is still
    # sending its request (a flood of half-open connections cannot lock out a health probe).
    max_connections: int = 256
    # Threads that answer complete requests; with the one that accepts and reads request heads,
    # an endpoint runs workers + 1 threads however many clients connect.
    workers: int = 4
    # `ipcount dashboard` answers only requests whose Host header is localhost, a loopback
    # address, its --host, or one of these (comma-separated names or addresses; "*": any).
    allowed_hosts: str = ""


@dataclass(frozen=True)
class Settings:
    """All of ipcount's settings."""

    kafka: KafkaSettings = field(default_factory=KafkaSettings)
    topics: TopicSettings = field(default_factory=TopicSettings)
    job: JobSettings = field(default_factory=JobSettings)
    sink: SinkSettings = field(default_factory=SinkSettings)
    broker: BrokerSettings = field(default_factory=BrokerSettings)
    spark: SparkSettings = field(default_factory=SparkSettings)
    metrics: MetricsSettings = field(default_factory=MetricsSettings)
    http: HttpSettings = field(default_factory=HttpSettings)
    # Where the settings came from, for messages ("defaults" when no file was read).
    source_path: str = "defaults"

    def replace(self, section: str, **changes: Any) -> Settings:
        """Return a copy with fields of one section changed (validated again)."""
        new = dataclasses.replace(
            self, **{section: dataclasses.replace(getattr(self, section), **changes)}
        )
        validate(new)
        return new


SECTIONS: dict[str, type] = {
    "kafka": KafkaSettings,
    "topics": TopicSettings,
    "job": JobSettings,
    "sink": SinkSettings,
    "broker": BrokerSettings,
    "spark": SparkSettings,
    "metrics": MetricsSettings,
    "http": HttpSettings,
}
# Free-form tables of dotted client/Spark keys: section -> table names.
PASSTHROUGH = {"kafka": ("client", "consumer", "producer", "admin"), "spark": ("conf",)}


# Bounds checked by one rule each: (section, key, least, strict, why). `strict`: the value must be
# above `least`, else at least `least`. `why` may name the value as {value}.
_BOUNDS: tuple[tuple[str, str, float, bool, str], ...] = (
    ("kafka", "connect_timeout_seconds", 0, True, "must be positive"),
    ("topics", "source_partitions", 1, False, "must be at least 1"),
    ("topics", "sink_partitions", 1, False, "must be at least 1"),
    ("topics", "replication_factor", 0, False, "must be at least 0"),
    ("job", "window_seconds", 0, True, "must be positive, got {value}"),
    ("job", "watermark_delay_seconds", 0, False, "must be zero or positive, got {value}"),
    ("job", "idle_timeout_seconds", 0, True, "must be positive"),
    ("job", "trigger_interval_seconds", 0, False, "must be zero (as fast as possible) or positive"),
    ("job", "max_offsets_per_trigger", 1, False, "must be at least 1"),
    ("job", "min_partitions", 0, False, "must be 0 (auto: twice the cores) or positive"),
    ("job", "max_records_per_partition", 0, False, "must be 0 (no limit) or positive"),
    ("job", "max_future_skew_seconds", 0, True, "must be positive"),
    ("job", "dead_letter_max_bytes", 1024, False, "must be at least 1024"),
    (
        "job",
        "dead_letter_interval_seconds",
        0,
        False,
        "must be zero (with every trigger) or positive",
    ),
    ("job", "max_bytes_per_batch", MIN_BYTES_PER_BATCH, False, "must be at least {least}"),
    ("job", "restart_attempts", 0, False, "must be 0 (no restarts) or more"),
    ("job", "restart_delay_seconds", 0, False, "must not be negative"),
    (
        "sink",
        "transaction_timeout_ms",
        MIN_TRANSACTION_TIMEOUT_MS,
        False,
        "must be at least {least}, got {value}",
    ),
    ("sink", "retry_deadline_seconds", 0, True, "must be positive"),
    ("broker", "start_timeout_seconds", 0, True, "must be positive"),
    ("broker", "transaction_max_timeout_ms", 1000, False, "must be at least 1000"),
    ("spark", "shuffle_partitions", 1, False, "must be at least 1"),
    ("metrics", "stall_triggers", 1, False, "must be at least 1"),
    ("metrics", "lag_poll_seconds", 0, True, "must be positive"),
    ("http", "request_timeout_seconds", 0, True, "must be positive"),
    ("http", "workers", 1, False, "must be at least 1"),
)
# Settings that take one of a few words: (section, key, choices).
_CHOICES: tuple[tuple[str, str, tuple[str, ...]], ...] = (
    ("kafka", "broker_quirks", ("auto", "noida-db", "none")),
    ("sink", "wire_format", WIRE_FORMATS),
    ("job", "native_helpers", NATIVE_MODES),
    ("broker", "kind", ("noida-db", "kafka")),
    ("spark", "state_store", ("rocksdb", "hdfs")),
)
_TOPIC_KEYS = ("source", "sink", "progress", "late", "dead_letter")

_Fail = Callable[[str, str, str], None]


def validate(s: Settings, origin: Mapping[tuple[str, ...], str] | None = None) -> None:
    """Check every setting; `origin`: where each (section, key) came from, for the message.

    Raises:
        ConfigError: the first wrong setting, by section.key (and where it was set).
    """
    where = origin or {}

    def fail(section: str, key: str, why: str) -> None:
        prefix = f"{where[(section, key)]}: " if where.get((section, key)) else ""
        raise ConfigError(f"{prefix}{section}.{key} {why}")

    _check_bounds(s, fail)
    _check_choices(s, fail)
    _check_kafka(s, fail)
    _check_topics(s, fail)
    _check_job(s, fail)
    _check_services(s, fail)


def _check_bounds(s: Settings, fail: _Fail) -> None:
    for section, key, least, strict, why in _BOUNDS:
        value = getattr(getattr(s, section), key)
        if value < least or (strict and value == least):
            fail(section, key, why.format(value=value, least=least))


def _check_choices(s: Settings, fail: _Fail) -> None:
    for section, key, choices in _CHOICES:
        value = getattr(getattr(s, section), key)
        if value not in choices:
            words = ", ".join(repr(c) for c in choices[:-1]) + f" or {choices[-1]!r}"
            fail(section, key, f"must be {words}, got {value!r}")


def _check_kafka(s: Settings, fail: _Fail) -> None:
    servers = s.kafka.bootstrap_servers
    if not servers.strip():
        fail("kafka", "bootstrap_servers", "must name at least one host:port")
    for entry in servers.split(","):
        host, _, port = entry.strip().rpartition(":")
        if not host or not port.isdigit():
            why = f"must be host:port[,host:port...], got {servers!r}"
            fail("kafka", "bootstrap_servers", why)


def _check_topics(s: Settings, fail: _Fail) -> None:
    names = [getattr(s.topics, key) for key in _TOPIC_KEYS]
    for key, name in zip(_TOPIC_KEYS, names, strict=True):
        if not name or len(name) > 249 or not all(c.isalnum() or c in "._-" for c in name):
            why = f"must be a valid Kafka topic name (letters, digits, '.', '_', '-'), got {name!r}"
            fail("topics", key, why)
    if len(set(names)) != len(names):
        fail("topics", "source", f"and the other topic names must all differ, got {names}")
    if s.topics.source_retention_ms < -1 or s.topics.source_retention_ms == 0:
        fail("topics", "source_retention_ms", "must be -1 (forever) or a positive number of ms")


def _check_job(s: Settings, fail: _Fail) -> None:
    job = s.job
    if (job.window_seconds * 1000) % 1:
        fail("job", "window_seconds", "must be a whole number of milliseconds")
    if not job.checkpoint_location.strip():
        fail("job", "checkpoint_location", "must name a directory (local path, hdfs://, s3a://)")
    so = job.starting_offsets.strip()
    if so not in ("earliest", "latest") and not so.startswith("{"):
        why = f"must be 'earliest', 'latest' or a JSON object, got {so!r}"
        fail("job", "starting_offsets", why)
    most = job.restart_attempts * job.restart_delay_seconds
    if job.restart_window_seconds < 0 or 0 < job.restart_window_seconds <= most:
        why = f"must be 0 (the job's life) or over attempts x delay ({most:g}s): a crash loop"
        fail("job", "restart_window_seconds", f"{why} must stop after job.restart_attempts")


def _check_services(s: Settings, fail: _Fail) -> None:
    """The sink's registry, and the ports and addresses the local services take."""
    if s.sink.wire_format == "confluent" and not s.sink.schema_registry_url:
        fail("sink", "schema_registry_url", "must be set when sink.wire_format = 'confluent'")
    if not 0 < s.broker.port < 65536:
        fail("broker", "port", f"must be a TCP port (1-65535), got {s.broker.port}")
    if not 0 <= s.metrics.port < 65536:
        fail("metrics", "port", f"must be 0 (off) or a TCP port (1-65535), got {s.metrics.port}")
    if not s.metrics.host.strip():
        fail("metrics", "host", "must name an address to listen on (127.0.0.1, 0.0.0.0, ::)")
    if s.http.max_connections < s.http.workers:
        fail("http", "max_connections", f"must be at least http.workers ({s.http.workers})")
