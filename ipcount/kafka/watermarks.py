"""A partition's (low, high) offsets, with the retries a leader move, a new topic's leader
election and a process stopped mid-request need."""

from __future__ import annotations

import logging
import time

from confluent_kafka import Consumer, KafkaError, KafkaException, TopicPartition

from ipcount.errors import BrokerError
from ipcount.kafka.client import describe_kafka_error

__all__ = ["LEADER_MOVING", "partition_offsets"]

logger = logging.getLogger(__name__)

# Answers of a partition whose leader moved (a broker killed, restarted, or out of the ISR) or is
# being elected: the client's metadata is stale. A metadata refresh and a retry cure them.
LEADER_MOVING = frozenset(
    {
        KafkaError.NOT_LEADER_FOR_PARTITION,  # NOT_LEADER_OR_FOLLOWER (6)
        KafkaError.LEADER_NOT_AVAILABLE,
        KafkaError.FENCED_LEADER_EPOCH,  # 74: our leader epoch is older than the broker's
        KafkaError.UNKNOWN_LEADER_EPOCH,  # 75: ours is newer (the broker has not caught up)
        KafkaError.REPLICA_NOT_AVAILABLE,
        KafkaError.KAFKA_STORAGE_ERROR,
        KafkaError.OFFSET_NOT_AVAILABLE,  # a new leader before its high watermark is known
        KafkaError._TRANSPORT,  # the old leader's connection died with it
        KafkaError._DESTROY_BROKER,  # it left the metadata while a request waited on it
        KafkaError._ALL_BROKERS_DOWN,
    }
)
# A topic created a moment ago is not known to every broker yet; longer, it does not exist.
_UNKNOWN_TOPIC = (KafkaError.UNKNOWN_TOPIC_OR_PART, KafkaError._UNKNOWN_PARTITION)
_NEW_TOPIC_GRACE_S = 2.0
_REFRESH_TIMEOUT_S = 2.0


def partition_offsets(
    probe: Consumer, topic: str, partition: int, timeout: float
) -> tuple[int, int]:
    """(low, high) of one partition as `probe`'s isolation sees it (read_committed: high is the
    last stable offset). A leader move (LEADER_MOVING: FENCED_LEADER_EPOCH, NOT_LEADER...,
    a dead leader's connection) costs a metadata refresh and a retry, until `timeout`; an unknown
    topic is retried for the moment a new one needs (~2 s).

    Raises:
        BrokerError: the offsets could not be queried within `timeout` seconds, or the topic
            does not exist.
    """
    tp = TopicPartition(topic, partition)
    start = time.monotonic()
    deadline = start + timeout
    # One more request after a local timeout, even past the deadline: a process stopped while the
    # request was in flight (SIGSTOP, a frozen VM) finds its deadline gone when it resumes, and a
    # fresh request tells that from a broker that does not answer.
    fresh: float | None = None
    while True:
        try:
            left = max(0.1, deadline - time.monotonic(), fresh or 0.0)
            low, high = probe.get_watermark_offsets(tp, timeout=left, cached=False)
            return low, high
        except KafkaException as exc:
            err = exc.args[0] if exc.args else None
            code = err.code() if isinstance(err, KafkaError) else None
            if code == KafkaError._TIMED_OUT and fresh is None:
                fresh = min(timeout, 5.0)
                # A SIGKILLed leader answers nothing: ask the one elected meanwhile.
                _refresh(probe, topic, time.monotonic() + fresh)
                continue
            now = time.monotonic()
            if code in _UNKNOWN_TOPIC and now - start > min(_NEW_TOPIC_GRACE_S, timeout):
                raise BrokerError(
                    f"cannot query the end of {topic}[{partition}]: the topic does not exist "
                    f"(create it with `ipcount topics create`): {describe_kafka_error(exc)}"
                ) from exc
            passing = (
                code in LEADER_MOVING
                or code in _UNKNOWN_TOPIC
                or (isinstance(err, KafkaError) and err.retriable())
            )
            if not passing or now > deadline:
                raise BrokerError(
                    f"cannot query the end of {topic}[{partition}]: {describe_kafka_error(exc)}"
                ) from exc
            logger.info(
                "the end of %s[%d]: %s; refreshing metadata and retrying",
                topic,
                partition,
                describe_kafka_error(exc),
            )
            _refresh(probe, topic, deadline)
            time.sleep(0.1)


def _refresh(probe: Consumer, topic: str, deadline: float) -> None:
    """Ask for `topic`'s metadata now (its partitions' leaders and epochs), not at the next
    topic.metadata.refresh.interval.ms; a failure here shows in the retried lookup."""
    try:
        probe.list_topics(
            topic=topic, timeout=max(0.1, min(_REFRESH_TIMEOUT_S, deadline - time.monotonic()))
        )
    except KafkaException as exc:
        logger.debug("metadata refresh of %s: %s", topic, describe_kafka_error(exc))
