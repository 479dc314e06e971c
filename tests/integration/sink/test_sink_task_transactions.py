"""The sink's per-task transactions against a real broker: each sink task's share in its own
transaction, two attempts of one task, the query's marker beside the tasks', what must be refused,
the start that ends the transactions a killed job's tasks left open, and what `ipcount chaos`
reads of them right after such a kill."""

from __future__ import annotations

import dataclasses
import json
import socket
import time
import uuid
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import KafkaException, Producer

from ipcount.chaos.check import crash_evidence
from ipcount.chaos.plan import AFTER_COMMIT
from ipcount.config import Settings
from ipcount.errors import SinkError, SinkHistoryError
from ipcount.formats.avro import IpCount, SingleObjectCodec
from ipcount.kafka.topic_reader import TopicReader
from ipcount.sink.fencing import fence_predecessors
from ipcount.sink.marker import ProgressMarker
from ipcount.sink.producer_config import TxnConfig, default_transactional_id
from ipcount.sink.runs import announce_run, read_progress
from ipcount.sink.task_commit import BATCH_ID_PROPERTY, commit_task, task_config
from ipcount.sink.transaction import TxnSession

CODEC = SingleObjectCodec()
W = 5000


class _Ctx:
    """What a sink task learns from Spark's TaskContext: its partition and its batch id."""

    def __init__(self, partition: int, batch_id: int) -> None:
        self.partition, self.batch_id = partition, batch_id

    def partitionId(self) -> int:  # noqa: N802 - pyspark's name
        return self.partition

    def getLocalProperty(self, key: str) -> str | None:  # noqa: N802 - pyspark's name
        return str(self.batch_id) if key == BATCH_ID_PROPERTY else None


def _config(settings: Settings, **changes: object) -> TxnConfig:
    qid = f"q-{uuid.uuid4().hex[:8]}"
    cfg = TxnConfig(
        topic=settings.topics.sink,
        progress_topic=settings.topics.progress,
        query_id=qid,
        transactional_id=default_transactional_id(qid),
        producer_conf=settings.kafka.to_librdkafka("producer"),
        consumer_conf=settings.kafka.to_librdkafka("consumer"),
        retry_deadline_seconds=10.0,
        fault_points=False,
    )
    return dataclasses.replace(cfg, **changes)  # type: ignore[arg-type]


def _records(batch: int, partition: int, n: int = 3) -> list[tuple[bytes, bytes]]:
    results = [
        IpCount(batch * W, (batch + 1) * W, f"10.{partition}.{batch}.{i}", i + 1) for i in range(n)
    ]
    return [(r.ip.encode(), CODEC.encode(dataclasses.asdict(r))) for r in results]


def _read(settings: Settings) -> list[str]:
    conf = settings.kafka.to_librdkafka("consumer")
    with TopicReader(conf, settings.topics.sink, isolation="read_committed") as reader:
        return sorted(CODEC.decode(r.value).ip for r in reader.read_to_end(20))  # type: ignore[arg-type]


def test_tasks_commit_their_shares_and_the_driver_their_sum(sink_settings: Settings) -> None:
    cfg = _config(sink_settings)
    reports = [commit_task(cfg, _Ctx(p, 0), _records(0, p)) for p in (0, 1)]
    assert [(r.status, r.records) for r in reports] == [("committed", 3), ("committed", 3)]
    driver = TxnSession(cfg)
    assert driver.commit_batch(0, [], written=(6, 0)).status == "committed"

    view = read_progress(cfg.consumer_conf, cfg.progress_topic, 10)
    assert view.newest(cfg.query_id) is not None
    assert view.newest(cfg.query_id).records == 6  # type: ignore[union-attr]
    for p in (0, 1):
        mine = view.newest(cfg.query_id, p)
        assert mine is not None and (mine.batch_id, mine.records) == (0, 3)
        assert mine.transactional_id == f"{cfg.transactional_id}-p{p}"
    assert _read(sink_settings) == sorted([f"10.{p}.0.{i}" for p in (0, 1) for i in range(3)])


def test_a_second_attempt_of_a_task_writes_nothing_twice(sink_settings: Settings) -> None:
    """Two attempts of one task (a retried task, a lost executor that still runs, a zombie job):
    the same transactional.id, so each fences the other; whichever commits first, the other finds
    its marker and skips the batch."""
    cfg = _config(sink_settings)
    first = TxnSession(task_config(cfg, 0))
    assert first.commit_batch(0, _records(0, 0)).status == "committed"  # warm producer
    # The second attempt of batch 1 commits; the first (warm, unaware) then tries batch 1 too.
    assert commit_task(cfg, _Ctx(0, 1), _records(1, 0)).status == "committed"
    assert first.commit_batch(1, _records(1, 0)).status == "replay"
    assert first.commit_batch(2, _records(2, 0)).status == "committed"
    assert _read(sink_settings) == sorted(f"10.0.{b}.{i}" for b in range(3) for i in range(3))


def _markers_of_other_queries(settings: Settings, n: int) -> None:
    """`n` committed markers of other queries: the hour of history a long-running job's
    progress topic holds before compaction."""
    producer = Producer(settings.kafka.to_librdkafka("producer"))
    for i in range(n):
        other = ProgressMarker(
            query_id=f"other-{i % 7}",
            batch_id=i,
            run_id="r",
            records=1,
            topic=settings.topics.sink,
            transactional_id="t",
            committed_at_ms=0,
        )
        producer.produce(settings.topics.progress, other.encode(), other.key)
    assert producer.flush(20) == 0


def test_a_task_fenced_by_another_worker_reads_only_the_new_part_of_the_progress_topic(
    sink_settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Spark runs a sink partition's task in whichever Python worker is free, so workers fence
    each other about every other batch, and the fenced one re-reads the progress topic: whether a
    newer start took over, and what the other worker committed. It reads only what came after
    its last read, not the hour of markers before it, and still skips what the other committed."""
    cfg = task_config(_config(sink_settings, run_id="0000000001000-cccccccc"), 0)
    announce_run(cfg.producer_conf, cfg.progress_topic, cfg.query_id, cfg.run_id)
    _markers_of_other_queries(sink_settings, 3000)
    read: list[int] = []
    poll = TopicReader.poll

    def counted(reader: TopicReader, *args: Any, **kwargs: Any) -> Any:
        got = poll(reader, *args, **kwargs)
        if reader.topic == cfg.progress_topic:
            read.extend(r.offset for r in got)
        return got

    monkeypatch.setattr(TopicReader, "poll", counted)
    first = TxnSession(cfg)  # the worker that wrote the partition's first batch
    assert first.commit_batch(0, _records(0, 0)).status == "committed"
    first.close()
    a, b = TxnSession(cfg), TxnSession(cfg)
    read.clear()
    assert a.commit_batch(1, _records(1, 0)).status == "committed"
    assert b.commit_batch(2, _records(2, 0)).status == "committed"
    assert len(read) > 2 * 3000  # each worker's first start reads the whole history
    for batch, session, status in [(3, a, "committed"), (3, b, "replay"), (4, b, "committed")]:
        read.clear()
        assert session.commit_batch(batch, _records(batch, 0)).status == status
        assert len(read) < 50, (batch, status)
    assert _read(sink_settings) == sorted(f"10.0.{b}.{i}" for b in range(5) for i in range(3))


def test_a_hand_over_between_workers_opens_no_client_but_its_producer(
    sink_settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each hand-over of a sink partition to the other Python worker (about every other batch)
    must start a producer: init_transactions fences the other. Every other client it used to open
    (the consumers of its two progress reads and of the fencing check, an admin client for the
    transaction timeout) is a connection, and in production a TLS handshake and a SASL login,
    every other batch: the worker keeps them, and still skips what the other committed."""
    import ipcount.kafka.client as client
    import ipcount.kafka.topic_reader as topic_reader
    import ipcount.sink.continuity as continuity
    import ipcount.sink.transaction as transaction

    opened: list[str] = []

    def counting(module: Any, name: str) -> None:
        cls = getattr(module, name)

        class Counted(cls):  # type: ignore[misc,valid-type]
            def __init__(self, *args: Any, **kwargs: Any) -> None:
                super().__init__(*args, **kwargs)
                opened.append(name)

        monkeypatch.setattr(module, name, Counted)

    for module, name in [
        (topic_reader, "Consumer"), (continuity, "Consumer"), (client, "AdminClient"),
        (transaction, "Producer"),
    ]:  # fmt: skip
        counting(module, name)
    cfg = task_config(_config(sink_settings, run_id="0000000001000-dddddddd"), 0)
    announce_run(cfg.producer_conf, cfg.progress_topic, cfg.query_id, cfg.run_id)
    a, b = TxnSession(cfg), TxnSession(cfg)
    for batch in range(4):  # each worker's first start, and its first check of its last commit
        assert (a, b)[batch % 2].commit_batch(batch, _records(batch, 0)).status == "committed"
    for batch, session, status, clients in [
        (4, a, "committed", ["Producer"]), (5, b, "committed", ["Producer"]),
        (5, a, "replay", ["Producer"]), (6, a, "committed", []), (7, b, "committed", ["Producer"]),
    ]:  # fmt: skip
        opened.clear()
        assert session.commit_batch(batch, _records(batch, 0)).status == status
        assert opened == clients, (batch, status)
    a.close()
    b.close()
    assert _read(sink_settings) == sorted(f"10.0.{b}.{i}" for b in range(8) for i in range(3))


def test_a_worker_that_takes_a_partition_over_produces_its_share_once(
    sink_settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A worker whose last commit of the partition is not the batch before asks the progress
    topic first: when the other worker committed since, its producer is fenced, and it starts a
    new one before it produces, instead of producing the whole share into a transaction the
    broker refuses and then again (5,000 records a task at 500k records a batch). A gap left by
    batches with no results for the partition is not a hand-over: it goes on with its producer."""
    import ipcount.sink.transaction as transaction

    produced: list[str] = []
    produce = transaction.produce

    def counted(producer: Any, topic: str, *args: Any, **kwargs: Any) -> None:
        produced.append(topic)
        produce(producer, topic, *args, **kwargs)

    monkeypatch.setattr(transaction, "produce", counted)
    cfg = task_config(_config(sink_settings, run_id="0000000001000-eeeeeeee"), 0)
    announce_run(cfg.producer_conf, cfg.progress_topic, cfg.query_id, cfg.run_id)
    a, b = TxnSession(cfg), TxnSession(cfg)
    steps = [(a, 0, "committed"), (b, 1, "committed"), (a, 2, "committed"), (b, 3, "committed")]
    steps += [(b, 5, "committed"), (a, 6, "committed"), (b, 7, "committed"), (b, 9, "committed")]
    for session, batch, status in steps:
        produced.clear()
        assert session.commit_batch(batch, _records(batch, 0)).status == status
        assert produced == [cfg.topic] * 3 + [cfg.progress_topic], (batch, produced)
    a.close()
    b.close()
    written = [f"10.0.{b}.{i}" for b in (0, 1, 2, 3, 5, 6, 7, 9) for i in range(3)]
    assert _read(sink_settings) == sorted(written)


def test_a_batch_the_query_recorded_is_skipped_by_every_task(sink_settings: Settings) -> None:
    """The query's marker covers its partitions: a task with no marker of its own (a partition
    that was empty, or a query whose driver wrote every result, as ipcount did before per-task
    commits) skips what it records."""
    cfg = _config(sink_settings)
    driver = TxnSession(cfg)
    assert driver.commit_batch(4, _records(4, 9)).status == "committed"
    assert commit_task(cfg, _Ctx(1, 4), _records(4, 1)).status == "replay"
    assert commit_task(cfg, _Ctx(1, 5), _records(5, 1)).status == "committed"
    assert _read(sink_settings) == sorted(
        [f"10.9.4.{i}" for i in range(3)] + [f"10.1.5.{i}" for i in range(3)]
    )


def test_a_task_asked_for_an_older_batch_stops(sink_settings: Settings) -> None:
    cfg = _config(sink_settings)
    commit_task(cfg, _Ctx(0, 7), _records(7, 0))
    with pytest.raises(SinkHistoryError, match="checkpoint is older than the sink's history"):
        commit_task(cfg, _Ctx(0, 6), _records(6, 0))


def test_the_start_ends_what_a_killed_jobs_tasks_left_open(sink_settings: Settings) -> None:
    """Tasks killed inside their transactions leave them open, and read_committed readers of the
    sink wait behind the first open one: the job's start fences every task's id (all at once)
    before it reads anything, and the zombies can then commit nothing."""
    cfg = _config(sink_settings)
    tids = [task_config(cfg, p).transactional_id for p in range(6)]
    zombies = []
    for p, tid in enumerate(tids):
        zombie = Producer({**cfg.producer_conf, "transactional.id": tid})
        zombie.init_transactions(10)
        zombie.begin_transaction()
        zombie.produce(cfg.topic, key=b"zombie", value=_records(0, p, 1)[0][1])
        assert zombie.flush(10) == 0
        zombies.append(zombie)
    assert commit_task(cfg, _Ctx(7, 0), _records(0, 7)).status == "committed"

    fence_predecessors(cfg.producer_conf, tids, cfg.transaction_timeout_ms, 20.0)

    assert _read(sink_settings) == sorted(f"10.7.0.{i}" for i in range(3))
    for zombie in zombies:
        with pytest.raises(KafkaException):
            zombie.commit_transaction(10)


def test_a_start_that_cannot_reach_the_broker_names_the_id() -> None:
    conf = {"bootstrap.servers": _closed_port()}
    with pytest.raises(SinkError, match="could not initialise transactional.id 'ipcount-q-x-p0'"):
        fence_predecessors(conf, ["ipcount-q-x-p0", "ipcount-q-x-p1"], 60_000, 2.0)


def _closed_port() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"127.0.0.1:{s.getsockname()[1]}"


def _open_attempt(cfg: TxnConfig, partition: int, batch: int) -> Producer:
    """A sink task's attempt at `batch` as a killed task leaves it: its results and its marker
    written in a transaction that was never ended."""
    tid = task_config(cfg, partition).transactional_id
    producer = Producer({**cfg.producer_conf, "transactional.id": tid})
    producer.init_transactions(10)
    producer.begin_transaction()
    for key, value in _records(batch, partition):
        producer.produce(cfg.topic, key=key, value=value)
    marker = ProgressMarker(
        cfg.query_id, batch, records=3, topic=cfg.topic, transactional_id=tid,
        sink_partition=partition,
    )  # fmt: skip
    producer.produce(cfg.progress_topic, key=marker.key, value=marker.encode())
    assert producer.flush(10) == 0
    return producer


def test_a_fresh_task_is_not_held_back_by_another_tasks_open_transaction(
    sink_settings: Settings,
) -> None:
    """A task killed inside its transaction leaves it open (its marker at the progress topic's
    end) until its retry fences it or the broker times it out. Another task's fresh session (a
    new executor, a new Python worker) must still learn its own partition's last commit at once,
    and tell it from an aborted attempt, instead of waiting behind the open transaction for its
    whole retry deadline."""
    cfg = _config(sink_settings, retry_deadline_seconds=15.0)
    p0 = task_config(cfg, 0)
    assert TxnSession(p0).commit_batch(0, _records(0, 0)).status == "committed"
    _open_attempt(cfg, 0, 1).abort_transaction(10)  # partition 0's attempt at batch 1 aborted
    killed = _open_attempt(cfg, 1, 1)  # partition 1's task killed inside batch 1

    started = time.monotonic()
    fresh = TxnSession(p0)
    assert fresh.commit_batch(0, _records(0, 0)).status == "replay"
    assert fresh.last_committed == 0  # the aborted attempt at batch 1 does not count
    assert fresh.commit_batch(1, _records(1, 0)).status == "committed"
    assert time.monotonic() - started < 10.0
    killed.abort_transaction(10)
    assert _read(sink_settings) == sorted(f"10.0.{b}.{i}" for b in range(2) for i in range(3))


def _checkpoint(tmp_path: Path, query: str) -> Path:
    """A checkpoint as Spark leaves it for a query that has committed no batch yet."""
    checkpoint = tmp_path / "checkpoint"
    (checkpoint / "commits").mkdir(parents=True)
    (checkpoint / "metadata").write_text(json.dumps({"id": query}) + "\n", encoding="utf-8")
    return checkpoint


def test_chaos_sees_a_commit_past_the_open_transactions_the_kill_left_behind_it(
    sink_settings: Settings, tmp_path: Path
) -> None:
    """Task 0 committed batch 1 and the fault point killed the job; task 1, mid-way through its
    own transaction of batch 1, died with it. The chaos evidence says task 0's commit is in
    Kafka, at once, instead of waiting for task 1's transaction to end (it ends only when the
    restart fences it)."""
    cfg = _config(sink_settings)
    assert TxnSession(task_config(cfg, 0)).commit_batch(1, _records(1, 0)).status == "committed"
    killed = _open_attempt(cfg, 1, 1)
    started = time.monotonic()
    evidence = crash_evidence(sink_settings, _checkpoint(tmp_path, cfg.query_id), AFTER_COMMIT, 1)
    took = time.monotonic() - started
    killed.abort_transaction(10)
    assert evidence == "batch not in Spark's commit log, committed in Kafka (sink task 0)"
    assert took < 10, took


def test_chaos_leaves_a_commit_behind_an_earlier_open_transaction_to_the_end_of_the_run(
    sink_settings: Settings, tmp_path: Path
) -> None:
    """Task 1 wrote its marker first and died before committing; task 0's commit came after it.
    No read_committed reader can see past task 1's open transaction until it ends, so the
    evidence says the marker is there and undecided (the end of the run confirms it), rather
    than 'NOT committed' or an unreadable topic."""
    cfg = _config(sink_settings)
    killed = _open_attempt(cfg, 1, 2)
    assert TxnSession(task_config(cfg, 0)).commit_batch(2, _records(2, 0)).status == "committed"
    evidence = crash_evidence(sink_settings, _checkpoint(tmp_path, cfg.query_id), AFTER_COMMIT, 2)
    killed.abort_transaction(10)
    assert evidence == (
        "batch not in Spark's commit log, marker in Kafka behind another task's open "
        "transaction, its commit confirmed at the end (sink task 0, 1)"
    )
