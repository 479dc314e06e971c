"""Before the sink writes a batch: the broker still holds the newest commit this sink knows of
(driver). A broker that acknowledged a commit and then lost it (noida-db stopped mid-commit; a
cluster restored from an older disk) would otherwise get the next batch written over the hole,
and the lost windows would never be counted."""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Mapping
from typing import Any

from confluent_kafka import Consumer, KafkaError, KafkaException, TopicPartition

from ipcount.errors import SinkError, SinkHistoryError
from ipcount.kafka.client import describe_kafka_error
from ipcount.kafka.consume import consumer_conf

__all__ = ["POSITION_KEY", "marker_missing", "check_still_committed"]

logger = logging.getLogger(__name__)

# Where a progress marker was read or written, [partition, offset]: kept beside the marker's
# fields in memory, never part of the record.
POSITION_KEY = "_position"


def check_still_committed(
    conf: Mapping[str, str],
    progress_topic: str,
    marker: Mapping[str, Any] | None,
    topic: str,
    next_batch: int,
    deadline_s: float,
) -> None:
    """Before `next_batch` is written: the newest marker this sink committed or read is still on
    the broker.

    Raises:
        SinkHistoryError: the broker lost it (the batch's output is gone with it).
        SinkError: the broker could not say (not a proven loss; the batch may be retried).
    """
    if marker is None:
        return
    missing = marker_missing(conf, progress_topic, marker, deadline_s)
    if missing is None:
        return
    raise SinkHistoryError(
        f"the broker lost a committed batch of {topic!r}: batch {marker['batchId']} "
        f"({marker.get('records', '?')} records, source offsets "
        f"{json.dumps(marker.get('sourceEnd'), sort_keys=True)}) was acknowledged as committed, "
        f"but its progress marker is gone: {missing}. The job stops rather than write batch "
        f"{next_batch} over the hole. Recover the broker's data (replicas, backups), or re-count "
        "from the last batch the broker has: restore the checkpoint copy that matches it, or "
        "start with `--new-query` on a new checkpoint"
    )


def marker_missing(
    conf: Mapping[str, str], progress_topic: str, marker: Mapping[str, Any], deadline_s: float
) -> str | None:
    """Whether the broker still holds `marker` where it was read or written.

    Returns:
        None when the record at the marker's position is that marker, visible to read_committed;
        else what the broker has there instead (the commit was lost).

    Raises:
        SinkError: the broker could not say within `deadline_s` (unreachable, or an older open
            transaction holds read_committed readers before the marker): not a proven loss.
    """
    position = marker.get(POSITION_KEY)
    if not position:
        return None  # a marker of unknown position (older ipcount) cannot be checked
    partition, offset = int(position[0]), int(position[1])
    where = f"{progress_topic}[{partition}]@{offset}"
    deadline = time.monotonic() + deadline_s
    # The record itself is read with read_uncommitted: a read_committed fetch that starts in the
    # middle of the log is not reliable on every broker (noida-db applies an aborted transaction
    # of the same producer that ended before the fetch offset, and hides the committed marker).
    # Whether its transaction is decided comes from the last stable offset.
    record = _record_at(conf, progress_topic, partition, offset, deadline)
    if isinstance(record, str):
        return record
    if record.key() != str(marker["queryId"]).encode() or _batch(record) != marker["batchId"]:
        return f"{where} holds another record"
    while True:
        stable = _end_offset(conf, "read_committed", progress_topic, partition, deadline_s)
        if stable > offset:
            return None
        if time.monotonic() > deadline:
            raise SinkError(
                f"the last committed progress marker at {where} is not yet stable after "
                f"{deadline_s:g}s (its transaction is open again on the broker, or an open "
                "transaction of another producer holds read_committed readers back)"
            )
        time.sleep(0.2)


def _record_at(
    conf: Mapping[str, str], topic: str, partition: int, offset: int, deadline: float
) -> Any:
    """The record at `offset` (read_uncommitted), or why there is none."""
    consumer = Consumer({**consumer_conf(conf, "read_uncommitted"), "enable.partition.eof": True})
    try:
        consumer.assign([TopicPartition(topic, partition, offset)])
        while time.monotonic() < deadline:
            msg = consumer.poll(min(0.5, max(deadline - time.monotonic(), 0.01)))
            if msg is None:
                continue
            err = msg.error()
            if err is None:
                if msg.offset() != offset:
                    return (
                        f"{topic}[{partition}]@{offset} is gone (the next record is {msg.offset()})"
                    )
                return msg
            if err.code() == KafkaError._PARTITION_EOF:
                return f"{topic}[{partition}] now ends at offset {msg.offset()}"
            logger.info("reading %s[%d]@%d: %s", topic, partition, offset, err)
        raise SinkError(
            f"cannot read {topic}[{partition}]@{offset}, the last committed progress marker, "
            "to check it is still there: the broker did not answer in time"
        )
    finally:
        consumer.close()


def _end_offset(
    conf: Mapping[str, str], isolation: str, topic: str, partition: int, timeout: float
) -> int:
    """The partition's end for `isolation`: read_committed answers the last stable offset."""
    consumer = Consumer(consumer_conf(conf, isolation))
    try:
        return int(consumer.get_watermark_offsets(TopicPartition(topic, partition), timeout)[1])
    except KafkaException as exc:
        raise SinkError(
            f"cannot read the end of {topic}[{partition}]: {describe_kafka_error(exc)}"
        ) from exc
    finally:
        consumer.close()


def _batch(msg: Any) -> int | None:
    try:
        return int(json.loads(msg.value() or b"")["batchId"])
    except (ValueError, KeyError, TypeError):
        return None
