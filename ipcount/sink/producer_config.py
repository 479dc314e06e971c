"""What the sink's transactional producer is given and what it reports: its config, the ids of a
query and of one start of it, a commit's outcome. Plain data, picklable."""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass, field

from ipcount.config import MIN_TRANSACTION_TIMEOUT_MS, SinkSettings, redact
from ipcount.errors import ConfigError

__all__ = [
    "Record",
    "TxnConfig",
    "CommitOutcome",
    "default_transactional_id",
    "task_transactional_id",
    "new_run_id",
]

# One Kafka record: (key, value), (key, value, headers), or (key, value, headers, topic) for a
# record bound for another topic of the same transaction (the late corrections).
Headers = list[tuple[str, bytes]]
Record = (
    tuple[bytes | None, bytes | None]
    | tuple[bytes | None, bytes | None, Headers | None]
    | tuple[bytes | None, bytes | None, Headers | None, str]
)


def default_transactional_id(query_id: str) -> str:
    """The transactional.id of a query: stable, so a restarted query fences its predecessor."""
    return f"ipcount-{query_id}"


def task_transactional_id(transactional_id: str, sink_partition: int) -> str:
    """The transactional.id of one sink task: the query's, with the task's sink partition; a
    newer attempt of the same task fences the older one."""
    return f"{transactional_id}-p{sink_partition}"


def new_run_id() -> str:
    """An id for one start of a job: '<start epoch ms>-<random>' (the time is for people reading
    logs; which start is newer is decided by the order of announcements, see sink.history)."""
    return f"{int(time.time() * 1000):013d}-{uuid.uuid4().hex[:8]}"


@dataclass(frozen=True)
class TxnConfig:
    """Everything the driver needs to commit batches (plain data: picklable)."""

    topic: str
    progress_topic: str
    query_id: str
    transactional_id: str
    # librdkafka settings, secrets included: kept out of repr (see __repr__).
    producer_conf: dict[str, str] = field(default_factory=dict, repr=False)
    consumer_conf: dict[str, str] = field(default_factory=dict, repr=False)
    transaction_timeout_ms: int = SinkSettings.transaction_timeout_ms
    retry_deadline_seconds: float = SinkSettings.retry_deadline_seconds
    # Which start of the job writes (new_run_id); recorded in each progress marker.
    run_id: str = ""
    # Where late-count corrections go, in the same transaction ("" = none are written).
    late_topic: str = ""
    # The query's checkpointLocation: the sink records each batch's source offsets from its offset
    # log, keeps commit receipts there and checks it against the markers ("" = no checks).
    checkpoint: str = ""
    # Whether the chaos tests' fault points (ipcount.faults) fire in this sink: the counting
    # query's only, so a kill lands in the transaction the chaos check inspects.
    fault_points: bool = True
    # Set on a sink task's session: the sink partition it writes (see sink.task_commit); None on
    # the driver's, whose transaction holds the query's marker.
    sink_partition: int | None = None

    def __repr__(self) -> str:
        return (
            f"TxnConfig(topic={self.topic!r}, progress_topic={self.progress_topic!r}, "
            f"query_id={self.query_id!r}, transactional_id={self.transactional_id!r}, "
            f"producer_conf={redact(self.producer_conf)!r}, "
            f"consumer_conf={redact(self.consumer_conf)!r}, "
            f"transaction_timeout_ms={self.transaction_timeout_ms}, "
            f"retry_deadline_seconds={self.retry_deadline_seconds}, run_id={self.run_id!r}, "
            f"late_topic={self.late_topic!r}, checkpoint={self.checkpoint!r}, "
            f"sink_partition={self.sink_partition!r})"
        )

    def __post_init__(self) -> None:
        for name in ("topic", "progress_topic", "query_id", "transactional_id"):
            if not getattr(self, name):
                raise ConfigError(f"the transactional sink needs {name} (empty)")
        if "bootstrap.servers" not in self.producer_conf:
            raise ConfigError("the transactional sink needs kafka.bootstrap.servers")
        if self.transaction_timeout_ms < MIN_TRANSACTION_TIMEOUT_MS:
            raise ConfigError(
                f"sink.transaction_timeout_ms must be at least {MIN_TRANSACTION_TIMEOUT_MS}, "
                f"got {self.transaction_timeout_ms}"
            )
        if self.retry_deadline_seconds <= 0:
            raise ConfigError("sink.retry_deadline_seconds must be positive")


@dataclass(frozen=True)
class CommitOutcome:
    """What `commit_batch` did: 'committed', 'replay' (already committed: skipped) or 'empty'."""

    status: str
    batch_id: int
    records: int
    seconds: float
