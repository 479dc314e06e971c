"""Before the sink writes a batch: the broker still holds the newest commit this sink knows of
(driver); a lost commit (noida-db stopped mid-commit; a cluster restored from an older disk) would
otherwise get the next batch written over the hole, and its windows never counted."""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping

from confluent_kafka import Consumer, KafkaError, Message, TopicPartition

from ipcount.errors import BrokerError, SinkError
from ipcount.kafka.topic_reader import consumer_conf
from ipcount.kafka.watermarks import partition_offsets
from ipcount.sink.history import lost_commit
from ipcount.sink.marker import ProgressMarker
from ipcount.sink.runs import read_progress

__all__ = ["StaleSession", "check_still_committed"]

logger = logging.getLogger(__name__)


class StaleSession(SinkError):  # noqa: N818 - a signal to the caller, not an error
    """Another Python worker of this job has committed batches after the one this session knows
    of: re-read the progress marker (re-initialise) and decide again."""


def check_still_committed(
    conf: Mapping[str, str],
    progress_topic: str,
    marker: ProgressMarker | None,
    topic: str,
    next_batch: int,
    deadline_s: float,
) -> None:
    """Before `next_batch` is written: the newest marker this sink committed or read is still
    committed on the broker.

    Raises:
        SinkHistoryError: the broker lost it (the batch's output is gone with it).
        StaleSession: the broker holds a newer marker of this query than the session knows.
        SinkError: the broker could not be asked.
    """
    if marker is None:
        return
    missing = _marker_missing(conf, progress_topic, marker, deadline_s)
    if missing is not None:
        raise lost_commit(topic, marker, f"{missing}; batch {next_batch} is not written")


def _marker_missing(
    conf: Mapping[str, str], progress_topic: str, marker: ProgressMarker, deadline_s: float
) -> str | None:
    """None when `marker` is still committed; else what the broker has instead."""
    if marker.position is None:
        logger.warning(
            "batch %s: the position of its progress marker is unknown: not checked",
            marker.batch_id,
        )
        return None
    partition, offset = marker.position
    where = f"{progress_topic}[{partition}]@{offset}"
    deadline = time.monotonic() + deadline_s
    stable_end = _end_offset(conf, "read_committed", progress_topic, partition, deadline_s)
    if stable_end > offset:
        # The cheap proof: a read_committed fetch at the marker's offset returns the marker.
        if _is_marker(
            _read_committed_at(conf, progress_topic, partition, offset, deadline), marker
        ):
            return None
    else:
        end = _end_offset(conf, "read_uncommitted", progress_topic, partition, deadline_s)
        if end <= offset:
            return f"{progress_topic}[{partition}] now ends at offset {end}, before its marker"
        # An open transaction that began before the marker holds read_committed readers back
        # (another query's, or a zombie's): nothing can be proven now. The check at the next
        # start (commit receipts against the markers) still stands behind this one.
        logger.warning(
            "cannot check %s now: an open transaction holds read_committed readers back "
            "(last stable offset %d); writing on",
            where,
            stable_end,
        )
        return None
    # Not at its offset. The marker may still be committed (a compacted-away older marker of
    # this query, a broker whose read_committed fetches from mid-log hide records after an
    # aborted transaction of the same producer, as noida-db's do): the whole topic, read as
    # every reader reads it, decides.
    view = read_progress(conf, progress_topic, deadline_s)
    newest = view.newest(marker.query_id, marker.sink_partition)
    if newest is not None and newest.batch_id > marker.batch_id:
        raise StaleSession(f"the broker holds batch {newest.batch_id} of this query")
    if newest is not None and newest.batch_id == marker.batch_id:
        return None
    have = "none" if newest is None else f"batch {newest.batch_id}"
    return (
        f"the newest progress marker the broker now has for this query is {have} (the marker "
        f"was written at {where})"
    )


def _is_marker(msg: Message | None, marker: ProgressMarker) -> bool:
    return msg is not None and msg.key() == marker.key and _batch(msg) == marker.batch_id


def _read_committed_at(
    conf: Mapping[str, str], topic: str, partition: int, offset: int, deadline: float
) -> Message | None:
    """The first committed record from `offset` on (None: the partition's stable end first)."""
    base = consumer_conf(conf, "read_committed")
    consumer = Consumer({**base, "enable.partition.eof": True, "auto.offset.reset": "latest"})
    try:
        consumer.assign([TopicPartition(topic, partition, offset)])
        while time.monotonic() < deadline:
            msg = consumer.poll(min(0.5, max(deadline - time.monotonic(), 0.01)))
            if msg is None:
                continue
            err = msg.error()
            if err is None:
                return msg
            if err.code() == KafkaError._PARTITION_EOF:
                return None
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
        # A leader move (FENCED_LEADER_EPOCH, NOT_LEADER...) costs a metadata refresh and a retry.
        return partition_offsets(consumer, topic, partition, timeout)[1]
    except BrokerError as exc:
        raise SinkError(str(exc)) from exc
    finally:
        consumer.close()


def _batch(msg: Message) -> int | None:
    """The batch id of the marker in `msg`; None when it holds no marker."""
    try:
        return ProgressMarker.decode(msg.value(), where="").batch_id
    except SinkError:
        return None
