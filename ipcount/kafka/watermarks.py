"""A partition's (low, high) offsets, with the retries a new topic's leader election and a
process stopped mid-request need."""

from __future__ import annotations

import time

from confluent_kafka import Consumer, KafkaError, KafkaException, TopicPartition

from ipcount.errors import BrokerError
from ipcount.kafka.client import describe_kafka_error

__all__ = ["partition_offsets"]

_LEADER_MOVING = (KafkaError.NOT_LEADER_FOR_PARTITION, KafkaError.LEADER_NOT_AVAILABLE)


def partition_offsets(
    probe: Consumer, topic: str, partition: int, timeout: float
) -> tuple[int, int]:
    """(low, high) of one partition as `probe`'s isolation sees it (read_committed: high is the
    last stable offset); retries for a moment while a new topic's leader is not yet known
    everywhere (Apache Kafka answers NOT_LEADER_FOR_PARTITION or LEADER_NOT_AVAILABLE for a moment
    after CreateTopics).

    Raises:
        BrokerError: the offsets could not be queried within `timeout` seconds.
    """
    tp = TopicPartition(topic, partition)
    deadline = time.monotonic() + timeout
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
            if isinstance(err, KafkaError) and err.code() == KafkaError._TIMED_OUT:
                if fresh is None:
                    fresh = min(timeout, 5.0)
                    continue
            passing = isinstance(err, KafkaError) and (
                err.retriable() or err.code() in _LEADER_MOVING
            )
            if not passing or time.monotonic() > deadline:
                raise BrokerError(
                    f"cannot query the end of {topic}[{partition}]: {describe_kafka_error(exc)}"
                ) from exc
            time.sleep(0.1)
