"""The progress topic read once (driver): the newest progress marker of every query and the order
of each query's announced starts, kept under one compacted key per query (`<query id>#run#recent`)
so a query started every few minutes for a year leaves one key, not one per start."""

from __future__ import annotations

import json
import logging
from collections.abc import Collection, Mapping, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass, field

from ipcount.errors import SinkError
from ipcount.kafka.client import with_client_logging
from ipcount.kafka.kept_readers import KeptReaders
from ipcount.kafka.quirks import broker_quirks
from ipcount.kafka.topic_reader import TopicReader
from ipcount.sink.marker import ProgressMarker

__all__ = [
    "RUN_SUFFIX",
    "MAX_RUNS",
    "RunHistory",
    "ProgressView",
    "read_progress",
    "announce_run",
    "run_order",
    "produce_one",
]

logger = logging.getLogger(__name__)

# Every key about a query's starts holds this infix (markers' keys are the query id, with
# sink.marker's partition suffix for a task's marker). Earlier
# versions wrote one key per start, `<query id>#run#<run id>`; now one per query holds the recent
# starts, `<query id>#run#recent`, and the next start writes tombstones for the old keys.
RUN_SUFFIX = "#run#"
_RECENT = "recent"
# How many starts the history keeps: fencing compares this start with the one that committed
# last; a start older than this many newer ones counts as superseded by any of them.
MAX_RUNS = 16


@dataclass(frozen=True)
class RunHistory:
    """A query's recent starts, oldest first: the value under `<query id>#run#recent`."""

    query_id: str
    runs: tuple[str, ...]

    @staticmethod
    def key(query_id: str) -> str:
        return f"{query_id}{RUN_SUFFIX}{_RECENT}"

    def encode(self) -> bytes:
        body = {"kind": "runs", "queryId": self.query_id, "runs": list(self.runs)}
        return json.dumps(body, separators=(",", ":")).encode()

    @staticmethod
    def decode(value: bytes) -> RunHistory | None:
        """None when the value is not a run history (then it is ignored, as before)."""
        try:
            body = json.loads(value)
            return RunHistory(str(body["queryId"]), tuple(str(r) for r in body["runs"]))
        except (ValueError, KeyError, TypeError):
            return None


@dataclass
class ProgressView:
    """What one read of the progress topic found: the newest marker of every query, each query's
    announced starts (oldest first, the broker's log order) and the one-key-per-start
    announcements of earlier versions still live (their keys, to be cleared)."""

    markers: dict[str, ProgressMarker] = field(default_factory=dict)
    # The newest marker of each (query, sink partition) its tasks wrote.
    partitions: dict[tuple[str, int], ProgressMarker] = field(default_factory=dict)
    runs: dict[str, list[str]] = field(default_factory=dict)
    legacy: dict[str, list[str]] = field(default_factory=dict)
    # How far it has read each partition of the topic: where a read that continues it starts.
    read_to: dict[int, int] = field(default_factory=dict)

    def add(self, key: bytes | None, value: bytes | None, where: tuple[int, int, str]) -> None:
        """Take one record of the topic, in log order (`where`: partition, offset, text)."""
        if key is not None and RUN_SUFFIX.encode() in key:
            self._add_run(key.decode("utf-8", "replace"), value)
            return
        shown = "none" if key is None else repr(key.decode("utf-8", "replace"))
        marker = ProgressMarker.decode(value, where=f"{where[2]} (key {shown})")
        newest = self.newest(marker.query_id, marker.sink_partition)
        if newest is not None and marker.batch_id < newest.batch_id:
            return
        if marker.sink_partition is None:
            self.markers[marker.query_id] = marker.at(where[0], where[1])
        else:
            self.partitions[marker.query_id, marker.sink_partition] = marker.at(*where[:2])

    def newest(self, query_id: str, sink_partition: int | None = None) -> ProgressMarker | None:
        """The newest marker of the query (`sink_partition` None) or of one of its sink tasks."""
        if sink_partition is None:
            return self.markers.get(query_id)
        return self.partitions.get((query_id, sink_partition))

    def _add_run(self, key: str, value: bytes | None) -> None:
        query, _, run = key.rpartition(RUN_SUFFIX)
        order = self.runs.setdefault(query, [])
        if run == _RECENT:
            history = RunHistory.decode(value) if value is not None else None
            if history is not None:
                order[:] = history.runs
            return
        legacy = self.legacy.setdefault(query, [])
        if key in legacy:
            legacy.remove(key)
        if value is None:
            return  # cleared by a later start: its run is in the history already
        legacy.append(key)
        try:
            announced = str(json.loads(value)["runId"])
        except (ValueError, KeyError, TypeError):
            return
        if announced in order:
            order.remove(announced)
        order.append(announced)


def read_progress(
    consumer_conf: Mapping[str, str],
    progress_topic: str,
    deadline_seconds: float,
    keys: Collection[bytes] | None = None,
    view: ProgressView | None = None,
    readers: KeptReaders | None = None,
) -> ProgressView:
    """Read the progress topic once (read_committed), to its end; with `keys`, only as far as
    the last record of any of those keys (see `_last_offsets`).

    With `view` (one this function returned before), only what came after it is read, and added
    to it: the same as reading the whole topic again, because a view takes records in log order
    and keeps the newest of each key, and compaction removes only records a later one replaces.
    A sink task re-reads the topic about every other batch (another worker of the job committed
    its partition), and the topic holds up to two hours of markers before compaction
    (topics.PROGRESS_CONFIG). Not on a broker whose read_committed reads that start mid-log hide
    commits (noida-db), nor when the log no longer holds where the view stopped (the topic was
    re-created or truncated): then the whole topic is read into a new view. `readers`: the
    consumers to read with, kept by the caller (else new ones, closed after the read).

    Raises:
        SinkError: a marker of the topic is not ipcount's.
    """
    if view is None or broker_quirks(consumer_conf).hides_commits_read_mid_log:
        view = ProgressView()
    since = dict(view.read_to)
    until = None
    if keys is not None:
        until = _last_offsets(consumer_conf, progress_topic, keys, deadline_seconds, since, readers)
        if until == {}:
            return view  # no record of those keys at all (since the view), committed or not
    with _reading(consumer_conf, progress_topic, "read_committed", since, readers) as reader:
        moved = any(reader.positions().get(p) != at for p, at in since.items())
        if not moved:
            for rec in reader.read_to_end(deadline_seconds, until=until):
                view.add(rec.key, rec.value, (rec.partition, rec.offset, rec.where))
            view.read_to = reader.positions()
    if moved:
        logger.info("%s no longer holds where the last read stopped: read anew", progress_topic)
        return read_progress(consumer_conf, progress_topic, deadline_seconds, keys, None, readers)
    return view


def _reading(
    consumer_conf: Mapping[str, str],
    progress_topic: str,
    isolation: str,
    since: Mapping[int, int],
    readers: KeptReaders | None,
) -> AbstractContextManager[TopicReader]:
    """A reader of the progress topic from `since`: a kept one, or a new one closed after."""
    if readers is not None:
        return readers.reading(isolation, since)
    return TopicReader(
        consumer_conf, progress_topic, isolation=isolation, topic_setting="topics.progress",
        start_at=since,
    )  # fmt: skip


def _last_offsets(
    consumer_conf: Mapping[str, str],
    progress_topic: str,
    keys: Collection[bytes],
    deadline_seconds: float,
    since: Mapping[int, int] | None = None,
    readers: KeptReaders | None = None,
) -> dict[int, int]:
    """Per partition, the offset after the last record of `keys`, committed or not (a
    read_uncommitted read to the end, which no open transaction holds back).

    Every committed marker of those keys lies before it, so a read_committed read that far sees
    them all, and waits only for transactions opened before it: not for one a killed task of
    another partition left open after them. Only the keys' own writers may add markers under
    them meanwhile, and a sink task's session has fenced its one (its transactional.id).
    """
    last: dict[int, int] = {}
    with _reading(
        consumer_conf, progress_topic, "read_uncommitted", since or {}, readers
    ) as reader:
        for rec in reader.read_to_end(deadline_seconds):
            if rec.key in keys:
                last[rec.partition] = rec.offset + 1
    return last


def run_order(
    consumer_conf: Mapping[str, str], progress_topic: str, query_id: str, deadline_seconds: float
) -> list[str]:
    """The announced starts of `query_id`, oldest first (the broker's log order; the last
    MAX_RUNS, with those of earlier versions not cleared yet)."""
    return read_progress(consumer_conf, progress_topic, deadline_seconds).runs.get(query_id, [])


def announce_run(
    producer_conf: Mapping[str, str],
    progress_topic: str,
    query_id: str,
    run_id: str,
    *,
    seen: ProgressView | None = None,
    consumer_conf: Mapping[str, str] | None = None,
) -> None:
    """Record in the progress topic that `run_id` is now the newest start of `query_id`.

    Every start of a query announces itself, before the query starts: the query's recent starts
    as `seen` read them (read now when not given), this one last, under the one key
    `<query id>#run#recent`; then tombstones for the keys earlier versions wrote one per start.
    Which start is newer is decided by this order (the broker's log order of starts), never by a
    clock. A sink whose producer was fenced stops for good once a start announced after its own
    has committed a batch; otherwise it re-initialises: the fencer was another Python worker of
    the same job, or a newer start that has committed nothing (and may be gone). Two starts at
    the same instant may each miss the other: the one missing from the history counts as the
    older of the two.

    Raises:
        SinkError: the broker did not acknowledge the records.
    """
    if seen is None:
        deadline = 30.0
        seen = read_progress(consumer_conf or producer_conf, progress_topic, deadline)
    runs = [r for r in seen.runs.get(query_id, []) if r != run_id] + [run_id]
    history = RunHistory(query_id, tuple(runs[-MAX_RUNS:]))
    records: list[tuple[str, bytes | None]] = [(RunHistory.key(query_id), history.encode())]
    records += [(key, None) for key in seen.legacy.get(query_id, [])]
    produce_one(producer_conf, progress_topic, records)


def produce_one(
    producer_conf: Mapping[str, str], topic: str, records: Sequence[tuple[str, bytes | None]]
) -> None:
    """Write (key, value) records in order, idempotently, and wait for the broker's acks.

    Raises:
        SinkError: the broker did not acknowledge them within 30 s.
    """
    from confluent_kafka import KafkaError, Message, Producer

    conf = {k: v for k, v in producer_conf.items() if not k.startswith("transaction")}
    conf.update({"enable.idempotence": "true", "acks": "all"})
    producer = Producer(with_client_logging(conf, "ipcount.history.librdkafka"))
    failures: list[str] = []

    def _delivered(err: KafkaError | None, _msg: Message) -> None:
        if err is not None:
            failures.append(str(err))

    for key, value in records:
        producer.produce(topic, value, key.encode(), on_delivery=_delivered)
    left = producer.flush(30)
    if left or failures:
        raise SinkError(
            f"could not write {records[0][0]!r} to {topic!r}: "
            + (failures[0] if failures else "not acknowledged within 30 s")
        )
