"""Topic provisioning from config: source, sink, progress (compacted), late, dead-letter."""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass

from confluent_kafka import KafkaError, KafkaException
from confluent_kafka.admin import AdminClient, NewTopic

from ipcount.config import Settings
from ipcount.errors import BrokerError
from ipcount.kafka.client import admin_client, describe_kafka_error, wait_for_metadata

__all__ = [
    "PROGRESS_CONFIG",
    "TopicSpec",
    "topic_specs",
    "ensure_topics",
    "missing_topics",
    "replication_factor",
]

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class TopicSpec:
    """A topic ipcount needs, with the partitions and settings it is created with."""

    name: str
    role: str
    partitions: int
    config: dict[str, str]


# The progress topic's settings (see topic_specs); for a topic made before they were set:
# kafka-configs.sh --alter --entity-type topics --entity-name PROGRESS --add-config segment.ms=...
PROGRESS_CONFIG = {
    "cleanup.policy": "compact",
    "segment.ms": "3600000",
    "max.compaction.lag.ms": "3600000",
    "min.cleanable.dirty.ratio": "0.1",
}


def topic_specs(settings: Settings) -> list[TopicSpec]:
    """The topics the configured pipeline uses."""
    t = settings.topics
    return [
        TopicSpec(
            t.source, "source", t.source_partitions, {"retention.ms": str(t.source_retention_ms)}
        ),
        TopicSpec(t.sink, "sink", t.sink_partitions, {}),
        # One compacted partition: the latest committed batch per query id. A marker a batch
        # (about one a second per query) would sit in the active segment, which compaction never
        # touches, until it rolls (7 days by default): every start reads the whole topic, so
        # roll and compact it within the hour and it stays small in the job's age.
        TopicSpec(t.progress, "progress", 1, PROGRESS_CONFIG),
        TopicSpec(t.late, "late", t.sink_partitions, {}),
        TopicSpec(
            t.dead_letter,
            "dead-letter",
            t.sink_partitions,
            {"retention.ms": str(t.source_retention_ms)},
        ),
    ]


def missing_topics(settings: Settings, names: list[str] | None = None) -> list[str]:
    """Which of the configured (or named) topics do not exist on the cluster."""
    conf = settings.kafka.to_librdkafka("admin")
    md = wait_for_metadata(conf, settings.kafka.connect_timeout_seconds)
    wanted = names if names is not None else [s.name for s in topic_specs(settings)]
    return [n for n in wanted if n not in md.topics]


def replication_factor(settings: Settings, brokers: int) -> int:
    """The replicas of a new topic: topics.replication_factor, or with 0 the cluster's size
    (`brokers`), at most 3."""
    return settings.topics.replication_factor or max(1, min(3, brokers))


def ensure_topics(settings: Settings) -> dict[str, str]:
    """Create every configured topic that does not exist yet; idempotent.

    Returns:
        topic name -> 'created' or 'exists'.

    Raises:
        BrokerError: the broker is unreachable or refuses to create a topic.
    """
    conf = settings.kafka.to_librdkafka("admin")
    md = wait_for_metadata(conf, settings.kafka.connect_timeout_seconds)
    specs = topic_specs(settings)
    replicas = replication_factor(settings, len(md.brokers))
    result: dict[str, str] = {}
    new: list[NewTopic] = []
    for spec in specs:
        if spec.name in md.topics:
            have = len(md.topics[spec.name].partitions)
            if have < spec.partitions:
                logger.warning(
                    "topic %s has %d partitions, config asks for %d: leaving it as it is",
                    spec.name,
                    have,
                    spec.partitions,
                )
            result[spec.name] = "exists"
        else:
            new.append(
                NewTopic(
                    spec.name,
                    num_partitions=spec.partitions,
                    replication_factor=replicas,
                    config=spec.config,
                )
            )
    if not new:
        return result
    logger.info("creating %s with %d replica(s)", ", ".join(t.topic for t in new), replicas)
    admin = admin_client(conf)
    futures = admin.create_topics(new, operation_timeout=settings.kafka.connect_timeout_seconds)
    for name, fut in futures.items():
        try:
            fut.result(timeout=settings.kafka.connect_timeout_seconds + 5)
            result[name] = "created"
            logger.info("created topic %s", name)
        except KafkaException as exc:
            err = exc.args[0] if exc.args else None
            if isinstance(err, KafkaError) and err.code() == KafkaError.TOPIC_ALREADY_EXISTS:
                result[name] = "exists"
                continue
            raise BrokerError(
                f"could not create topic {name}: {describe_kafka_error(exc)}"
            ) from exc
    _wait_for_leaders(admin, [t.topic for t in new], settings.kafka.connect_timeout_seconds)
    return {spec.name: result[spec.name] for spec in specs}


def _wait_for_leaders(admin: AdminClient, names: list[str], timeout: float) -> None:
    """Wait until every partition of the new topics has a leader: Apache Kafka acknowledges
    CreateTopics before its metadata shows them, and a client that comes next (the job, a
    producer's first send) would otherwise meet UNKNOWN_TOPIC_OR_PART or NOT_LEADER errors."""
    deadline = time.monotonic() + timeout
    pending = set(names)
    while pending:
        md = admin.list_topics(timeout=max(0.5, deadline - time.monotonic()))
        for name in list(pending):
            topic = md.topics.get(name)
            if (
                topic is not None
                and topic.error is None
                and topic.partitions
                and all(part.leader >= 0 for part in topic.partitions.values())
            ):
                pending.discard(name)
        if not pending:
            return
        if time.monotonic() > deadline:
            raise BrokerError(
                f"topic(s) {', '.join(sorted(pending))} were created but have no partition leader "
                f"after {timeout:g}s; check the broker's log"
            )
        time.sleep(0.1)
