"""The transactional sink's commit path against a real broker: replay, kill -9, fencing, timeouts."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
import uuid
from collections.abc import Callable

import pytest

from ipcount.config import Settings
from ipcount.errors import ConfigError, FatalKafkaError, IpcountError
from ipcount.formats.avro import IpCount, SingleObjectCodec
from ipcount.kafka.topic_reader import TopicReader
from ipcount.sink.history import announce_run
from ipcount.sink.producer_config import TxnConfig, default_transactional_id
from ipcount.sink.transaction import TxnSession
from ipcount.verify.compare import compare
from ipcount.verify.ledger import Ledger

CODEC = SingleObjectCodec()
W = 5000

# A separate process that commits batches with the sink's transactional code; IPCOUNT_FAULTS
# in its environment SIGKILLs it (its own process group) at a fault point.
CHILD = r"""
import json, sys
from ipcount.sink.transaction import TxnSession
from ipcount.sink.producer_config import TxnConfig
cfg = TxnConfig(**json.loads(sys.argv[1]))
session = TxnSession(cfg)
for batch_id, records in json.loads(sys.argv[2]):
    session.commit_batch(batch_id, [(bytes.fromhex(k), bytes.fromhex(v)) for k, v in records])
print("all batches committed")
"""


def _config(settings: Settings, query_id: str | None = None, **changes: object) -> TxnConfig:
    qid = query_id or f"q-{uuid.uuid4().hex[:8]}"
    cfg = TxnConfig(
        topic=settings.topics.sink,
        progress_topic=settings.topics.progress,
        query_id=qid,
        transactional_id=default_transactional_id(qid),
        producer_conf=settings.kafka.to_librdkafka("producer"),
        consumer_conf=settings.kafka.to_librdkafka("consumer"),
        retry_deadline_seconds=10.0,
    )
    return dataclasses.replace(cfg, **changes)  # type: ignore[arg-type]


def _results(batch: int, n: int) -> list[IpCount]:
    return [IpCount(batch * W, (batch + 1) * W, f"10.{batch}.0.{i}", i + 1) for i in range(n)]


def _records(results: list[IpCount]) -> list[tuple[bytes, bytes]]:
    return [(r.ip.encode(), CODEC.encode(dataclasses.asdict(r))) for r in results]


def _read(
    settings: Settings,
    isolation: str = "read_committed",
    topic: str | None = None,
    deadline: float = 20.0,
) -> list[IpCount]:
    conf = settings.kafka.to_librdkafka("consumer")
    with TopicReader(conf, topic or settings.topics.sink, isolation=isolation) as reader:
        return [CODEC.decode(r.value) for r in reader.read_to_end(deadline)]  # type: ignore[arg-type]


def _end(settings: Settings, topic: str) -> int:
    with TopicReader(settings.kafka.to_librdkafka("consumer"), topic) as reader:
        return sum(high for _, high in reader.watermarks().values())


def _ledger(*batches: list[IpCount]) -> Ledger:
    ledger = Ledger(window_ms=W)
    for results in batches:
        for r in results:
            ledger.add(r.window_start, r.ip, r.count)
    return ledger


def _judge(settings: Settings, ledger: Ledger, isolation: str) -> str:
    results = [(f"#{i}", r) for i, r in enumerate(_read(settings, isolation))]
    return compare(results, ledger, isolation).summary()


def test_replayed_and_empty_batches_write_nothing(sink_settings: Settings) -> None:
    cfg = _config(sink_settings)
    b0, b1 = _results(0, 50), _results(1, 30)
    session = TxnSession(cfg)
    assert session.commit_batch(0, _records(b0)).status == "committed"
    assert session.commit_batch(0, _records(b0)).status == "replay"
    assert session.commit_batch(1, []).status == "empty"
    assert session.commit_batch(2, _records(b1)).status == "committed"
    sink_end, progress_end = _end(sink_settings, cfg.topic), _end(sink_settings, cfg.progress_topic)

    # A restarted driver (fresh session, same query) learns the last batch from the marker.
    restarted = TxnSession(cfg)
    restarted.start()
    assert restarted.last_committed == 2
    for batch_id, results in ((0, b0), (2, b1), (1, [])):
        assert restarted.commit_batch(batch_id, _records(results)).status in ("replay", "empty")
    assert _end(sink_settings, cfg.topic) == sink_end
    assert _end(sink_settings, cfg.progress_topic) == progress_end

    # Even a read_uncommitted reader sees every result once: nothing was ever written twice.
    assert sorted(_read(sink_settings, "read_uncommitted"), key=str) == sorted(b0 + b1, key=str)
    # Progress markers are per query: another query id starts from scratch.
    other = TxnSession(_config(sink_settings))
    other.start()
    assert other.last_committed is None


def test_failure_while_producing_aborts_the_transaction(sink_settings: Settings) -> None:
    cfg = _config(sink_settings)
    session = TxnSession(cfg)
    b0 = _results(0, 20)
    session.commit_batch(0, _records(b0))

    def broken():  # yields some records, then the batch's input fails
        yield from _records(_results(1, 10))
        raise RuntimeError("input failed mid-batch")

    with pytest.raises(RuntimeError, match="mid-batch"):
        session.commit_batch(1, broken())
    assert session.last_committed == 0
    b1 = _results(1, 10)
    assert session.commit_batch(1, _records(b1)).status == "committed"
    ledger = _ledger(b0, b1)
    assert _judge(sink_settings, ledger, "read_committed").endswith("exact=true")
    # Whatever of the aborted attempt reached the broker (librdkafka purges what it had not sent
    # yet) is visible only to read_uncommitted readers.
    uncommitted = _judge(sink_settings, ledger, "read_uncommitted")
    assert int(uncommitted.split("duplicates=")[1].split()[0]) <= 10


@pytest.mark.parametrize(
    ("point", "aborted_copies"),
    [("sink.before_commit", 1), ("sink.after_commit", 0)],
)
def test_kill9_then_restart_with_same_query_id(
    sink_settings: Settings, point: str, aborted_copies: int
) -> None:
    cfg = _config(sink_settings)
    b0, b1 = _results(0, 40), _results(1, 25)
    batches = [[i, [[k.hex(), v.hex()] for k, v in _records(b)]] for i, b in ((0, b0), (1, b1))]
    env = {k: v for k, v in os.environ.items() if not k.startswith("IPCOUNT_FAULTS")}
    env["IPCOUNT_FAULTS"] = f"{point}@1"
    child = subprocess.run(
        [sys.executable, "-c", CHILD, json.dumps(dataclasses.asdict(cfg)), json.dumps(batches)],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        # Its own process group: the fault kills the child's group, not pytest's.
        start_new_session=True,
    )
    assert child.returncode == -9, child.stderr[-2000:]
    assert "all batches committed" not in child.stdout

    if point == "sink.before_commit":
        # The killed producer's transaction is still open: read_committed readers are held back
        # (noida-db never times transactions out), read_uncommitted ones already see batch 1.
        with pytest.raises(IpcountError, match="open transaction holds read_committed readers"):
            _read(sink_settings, "read_committed", deadline=1.0)
        assert len(_read(sink_settings, "read_uncommitted")) == len(b0) + len(b1)

    # Restart with the same query id: init_transactions fences the dead producer and aborts its
    # transaction; the progress marker says which batches are in Kafka.
    restarted = TxnSession(cfg)
    restarted.start()
    assert restarted.last_committed == (0 if point == "sink.before_commit" else 1)
    outcome = restarted.commit_batch(1, _records(b1))  # Spark replays batch 1
    assert outcome.status == ("committed" if point == "sink.before_commit" else "replay")
    assert restarted.commit_batch(2, _records(_results(2, 5))).status == "committed"

    ledger = _ledger(b0, b1, _results(2, 5))
    committed = _judge(sink_settings, ledger, "read_committed")
    assert committed.endswith("results=70 missing=0 duplicates=0 wrong=0 exact=true"), committed
    uncommitted = _judge(sink_settings, ledger, "read_uncommitted")
    dupes = aborted_copies * len(b1)
    assert f"duplicates={dupes} wrong=0 exact={'false' if dupes else 'true'}" in uncommitted


def test_zombie_writer_is_fenced_for_good_whatever_the_clocks(sink_settings: Settings) -> None:
    """Each start of a job announces itself (as `ipcount run` does before its query starts). A
    fenced writer stops for good once a start announced after its own has committed; until then
    it re-initialises (the newer start may be gone). Which start is newer is the broker's log
    order, not the run ids' clock readings."""
    base = _config(sink_settings)
    producer_conf = sink_settings.kafka.to_librdkafka("producer")
    progress = sink_settings.topics.progress
    # The zombie's host clock runs far ahead: its run id sorts after the newer job's.
    zombie_run, newer_run = "9999999999999-aaaaaaaa", "0000000000001-bbbbbbbb"
    announce_run(producer_conf, progress, base.query_id, zombie_run)
    old = TxnSession(dataclasses.replace(base, run_id=zombie_run))
    old.commit_batch(0, _records(_results(0, 5)))
    # A second job on the same checkpoint / transactional.id starts: announce, then fence.
    announce_run(producer_conf, progress, base.query_id, newer_run)
    new = TxnSession(dataclasses.replace(base, run_id=newer_run))
    new.start()
    assert new.last_committed == 0
    # The newer start has committed nothing yet (it could be gone): the old one re-initialises
    # (fencing it) and commits batch 1 exactly once.
    assert old.commit_batch(1, _records(_results(1, 5))).status == "committed"
    # The newer one, fenced in turn, is the newest start: it re-initialises, sees batch 1
    # committed and skips its replay, then commits batch 2.
    assert new.commit_batch(1, _records(_results(1, 5))).status == "replay"
    assert new.commit_batch(2, _records(_results(2, 7))).status == "committed"
    # Now a newer start has committed: the old one stops for good and does not fence it back.
    with pytest.raises(FatalKafkaError) as info:
        old.commit_batch(3, _records(_results(3, 2)))
    text = str(info.value)
    assert "fenced for good" in text and base.transactional_id in text
    assert "same checkpoint" in text and newer_run in text
    assert not old.started
    assert new.commit_batch(3, _records(_results(3, 2))).status == "committed"
    for isolation in ("read_committed", "read_uncommitted"):
        got = _read(sink_settings, isolation)
        want = _results(0, 5) + _results(1, 5) + _results(2, 7) + _results(3, 2)
        assert sorted(got, key=str) == sorted(want, key=str), isolation


def test_sibling_workers_of_one_job_take_turns(sink_settings: Settings) -> None:
    """Spark may run one query's commits in different reused Python workers of the same job:
    each has its own producer for the transactional.id and fences the other. Not a zombie."""
    cfg = dataclasses.replace(_config(sink_settings), run_id="0000000001000-cccccccc")
    announce_run(
        sink_settings.kafka.to_librdkafka("producer"),
        sink_settings.topics.progress,
        cfg.query_id,
        cfg.run_id,
    )
    a, b = TxnSession(cfg), TxnSession(cfg)
    assert a.commit_batch(0, _records(_results(0, 3))).status == "committed"
    assert b.commit_batch(1, _records(_results(1, 3))).status == "committed"
    assert a.commit_batch(2, _records(_results(2, 3))).status == "committed"
    assert b.commit_batch(2, _records(_results(2, 3))).status == "replay"
    assert b.commit_batch(3, _records(_results(3, 3))).status == "committed"
    got = _read(sink_settings)
    want = _results(0, 3) + _results(1, 3) + _results(2, 3) + _results(3, 3)
    assert sorted(got, key=str) == sorted(want, key=str)


def test_transaction_timeout_above_broker_maximum(sink_settings: Settings) -> None:
    cfg = _config(sink_settings, transaction_timeout_ms=900_001)
    with pytest.raises(ConfigError) as info:
        TxnSession(cfg).commit_batch(0, _records(_results(0, 1)))
    text = str(info.value)
    assert "sink.transaction_timeout_ms = 900001 ms" in text
    assert "transaction.max.timeout.ms" in text
    assert _read(sink_settings, "read_uncommitted") == []


def test_missing_topics_are_named(make_settings: Callable[..., Settings]) -> None:
    settings = make_settings()  # topics not created
    with pytest.raises(ConfigError, match="does not exist: run `ipcount topics create`"):
        TxnSession(_config(settings)).start()


def test_abortable_error_classification(sink_settings: Settings) -> None:
    """A record too large for the producer fails the transaction, which is aborted; a retry would
    meet the same record, so the error is final (no restart loop); other batches still commit."""
    cfg = _config(
        sink_settings,
        producer_conf={
            **sink_settings.kafka.to_librdkafka("producer"),
            "message.max.bytes": "2000",
        },
    )
    session = TxnSession(cfg)
    big = [(b"k", b"x" * 5000)]
    with pytest.raises(FatalKafkaError, match="transaction was aborted") as info:
        session.commit_batch(0, big)
    assert "MSG_SIZE_TOO_LARGE" in str(info.value)
    assert "for its content" in str(info.value) and "message.max.bytes" in str(info.value)
    assert session.started and session.last_committed is None
    b0 = _results(0, 3)
    assert session.commit_batch(0, _records(b0)).status == "committed"
    assert sorted(_read(sink_settings), key=str) == sorted(b0, key=str)


def test_batch_larger_than_the_producer_queue(sink_settings: Settings) -> None:
    """A batch (and its progress marker) bigger than librdkafka's local queue still commits."""
    producer_conf = {
        **sink_settings.kafka.to_librdkafka("producer"),
        "queue.buffering.max.messages": "50",
    }
    session = TxnSession(_config(sink_settings, producer_conf=producer_conf))
    b0 = _results(0, 500)
    assert session.commit_batch(0, _records(b0)).records == 500
    assert len(_read(sink_settings, "read_committed")) == 500
