"""Before the sink writes a batch: the broker still holds the newest commit this sink knows of
(driver); a lost commit (noida-db stopped mid-commit; a cluster restored from an older disk) would
otherwise get the next batch written over the hole, and its windows never counted."""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping

from confluent_kafka import Consumer, KafkaError, Message, TopicPartition

from ipcount.errors import BrokerError, SinkError
from ipcount.kafka import SHORT_FETCH_WAIT_MS
from ipcount.kafka.topic_reader import consumer_conf
from ipcount.kafka.watermarks import partition_offsets
from ipcount.sink.history import lost_commit
from ipcount.sink.marker import ProgressMarker
from ipcount.sink.runs import read_progress

__all__ = ["ContinuityProbe", "StaleSession", "check_still_committed"]

logger = logging.getLogger(__name__)

# How long the check waits for its own last commit's markers to be written (see _stable_end_past),
# and how often it asks meanwhile.
_SETTLE_SECONDS = 0.25
_SETTLE_POLL_SECONDS = 0.005


class StaleSession(SinkError):  # noqa: N818 - a signal to the caller, not an error
    """Another Python worker of this job has committed batches after the one this session knows
    of: re-read the progress marker (re-initialise) and decide again."""


class ContinuityProbe:
    """The read_committed consumer a sink session checks its last commit with, kept across
    batches: a consumer per check (two, with their threads and connections) was over half of a
    commit's time against a local broker (6.1 of 10.5 ms; 15 of 30 ms just after its start). It
    holds no partition between checks."""

    def __init__(self, conf: Mapping[str, str]) -> None:
        # The session's consumer settings: the rare reads beyond the probe's (read_uncommitted,
        # the whole progress topic) use them too.
        self.conf = conf
        self._consumer: Consumer | None = None

    def consumer(self) -> Consumer:
        """The probe's consumer, created on first use."""
        if self._consumer is None:
            base = consumer_conf(self.conf, "read_committed")
            self._consumer = Consumer(
                {
                    **base,
                    "enable.partition.eof": True,
                    "auto.offset.reset": "latest",
                    "fetch.wait.max.ms": SHORT_FETCH_WAIT_MS,
                }
            )
        return self._consumer

    def close(self) -> None:
        """Close the consumer (the next check creates another)."""
        consumer, self._consumer = self._consumer, None
        if consumer is not None:
            consumer.close()


def check_still_committed(
    probe: ContinuityProbe,
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
        SinkError: the broker could not be asked (the probe is closed then: the next check starts
            a new one).
    """
    if marker is None:
        return
    try:
        missing = _marker_missing(probe, progress_topic, marker, deadline_s)
    except SinkError as exc:
        if not isinstance(exc, StaleSession):
            probe.close()
        raise
    if missing is not None:
        raise lost_commit(topic, marker, f"{missing}; batch {next_batch} is not written")


def _marker_missing(
    probe: ContinuityProbe,
    progress_topic: str,
    marker: ProgressMarker,
    deadline_s: float,
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
    stable_end = _stable_end_past(probe.consumer(), progress_topic, partition, offset, deadline_s)
    if stable_end > offset:
        # The cheap proof: a read_committed fetch at the marker's offset returns the marker.
        if _is_marker(
            _read_committed_at(probe.consumer(), progress_topic, partition, offset, deadline),
            marker,
        ):
            return None
    else:
        uncommitted = Consumer(consumer_conf(probe.conf, "read_uncommitted"))
        try:
            end = _end_offset(uncommitted, progress_topic, partition, deadline_s)
        finally:
            uncommitted.close()
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
    view = read_progress(probe.conf, progress_topic, deadline_s)
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
    consumer: Consumer, topic: str, partition: int, offset: int, deadline: float
) -> Message | None:
    """The first committed record from `offset` on (None: the partition's stable end first),
    read with `consumer` (the probe's, read_committed), which holds the partition only
    meanwhile."""
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
        consumer.unassign()


def _stable_end_past(
    consumer: Consumer, topic: str, partition: int, offset: int, timeout: float
) -> int:
    """The partition's last stable offset, asked again for up to _SETTLE_SECONDS while it is not
    past `offset`: a commit returns once the coordinator has logged it, and it writes the commit
    markers to the partitions after that, so right after this sink's own commit the stable end
    may still stand at its marker."""
    settle = time.monotonic() + _SETTLE_SECONDS
    while True:
        end = _end_offset(consumer, topic, partition, timeout)
        if end > offset or time.monotonic() >= settle:
            return end
        time.sleep(_SETTLE_POLL_SECONDS)


def _end_offset(consumer: Consumer, topic: str, partition: int, timeout: float) -> int:
    """The partition's end for `consumer`'s isolation level: read_committed answers the last
    stable offset."""
    try:
        # A leader move (FENCED_LEADER_EPOCH, NOT_LEADER...) costs a metadata refresh and a retry.
        return partition_offsets(consumer, topic, partition, timeout)[1]
    except BrokerError as exc:
        raise SinkError(str(exc)) from exc


def _batch(msg: Message) -> int | None:
    """The batch id of the marker in `msg`; None when it holds no marker."""
    try:
        return ProgressMarker.decode(msg.value(), where="").batch_id
    except SinkError:
        return None
