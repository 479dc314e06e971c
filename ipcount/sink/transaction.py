"""The sink's transactional session: one Kafka transaction per micro-batch with its records and a
progress marker, and idempotent replay (each sink task's; the driver's holds the query's marker)."""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable

from confluent_kafka import KafkaError, KafkaException, Message, Producer

from ipcount.errors import ConfigError, FatalKafkaError, SinkError
from ipcount.faults import fault_point
from ipcount.kafka.client import check_transaction_timeout, with_client_logging
from ipcount.sink.batch_checkpoint import batch_source_end, write_receipt
from ipcount.sink.continuity import ContinuityProbe, StaleSession, check_still_committed
from ipcount.sink.history import check_checkpoint, check_replay
from ipcount.sink.marker import JsonValue, ProgressMarker
from ipcount.sink.producer_calls import TxnCalls, is_fenced, produce
from ipcount.sink.producer_config import CommitOutcome, Record, TxnConfig
from ipcount.sink.progress_reads import ProgressReads
from ipcount.sink.task_history import older_than_committed

__all__ = ["TxnSession"]

logger = logging.getLogger(__name__)


class TxnSession(TxnCalls):
    """One transactional producer for one transactional.id, and the last batch it committed.

    `start()` (called by the first commit) checks the topics and the transaction timeout,
    runs init_transactions (fencing any older producer with this id and aborting its open
    transaction) and then reads the progress marker with read_committed.
    """

    def __init__(self, config: TxnConfig) -> None:
        super().__init__(config)
        self.last_committed: int | None = None
        # The run id in the newest progress marker (who committed last_committed).
        self.last_run_id: str = ""
        # The newest progress marker of this query (None: it has committed nothing).
        self.last_marker: ProgressMarker | None = None
        # What checks, before each commit, that the last one is still on the broker.
        self._probe = ContinuityProbe(config.consumer_conf)
        # Its reads of the progress topic (a sink task's view survives a fence).
        self._reads = ProgressReads(config)
        # Whether the transaction timeout was checked: at the first start only, not at each
        # re-initialisation after another worker's commit (its two admin clients and their
        # requests were a fifth of a hand-over).
        self._checked = False

    def start(self) -> None:
        """Create the producer, fence predecessors, and load the last committed batchId.

        Raises:
            ConfigError: a topic is missing, or the transaction timeout is above the broker's.
            FatalKafkaError / SinkError: the producer could not be initialised.
        """
        cfg = self.config
        producer_conf = dict(cfg.producer_conf)
        # Java clients' partitioner: the same IP lands in the same partition whoever writes it.
        producer_conf.setdefault("partitioner", "murmur2_random")
        producer_conf.update(
            {
                "transactional.id": cfg.transactional_id,
                "transaction.timeout.ms": str(cfg.transaction_timeout_ms),
                "enable.idempotence": "true",
            }
        )
        if not self._checked:
            check_transaction_timeout(cfg.producer_conf, cfg.transaction_timeout_ms)
        self._checked = True
        producer = Producer(with_client_logging(producer_conf, "ipcount.txn.librdkafka"))
        # Also what init_transactions needs: a new producer that finds no broker connection up yet
        # tries again only 500 ms later (librdkafka's idempotence timer); without this metadata
        # request first, 4 in 10 hand-overs waited that out.
        self._check_topics(producer)
        self._producer = producer
        try:
            self._call("init_transactions", lambda t: producer.init_transactions(t))
            self.last_committed, self.last_run_id = self._read_progress()
            if cfg.checkpoint:
                check_checkpoint(self.last_marker, cfg.checkpoint, cfg.topic)
        except BaseException:
            # Never keep a producer whose last committed batch is unknown: it could rewrite one.
            self._discard()
            raise
        logger.debug(
            "transactional.id %s ready: last committed batch of query %s is %s",
            cfg.transactional_id,
            cfg.query_id,
            self.last_committed,
        )

    def commit_batch(
        self,
        batch_id: int,
        records: Iterable[Record],
        written: tuple[int, int] | None = None,
    ) -> CommitOutcome:
        """Write one micro-batch in one transaction, together with its progress marker.

        Args:
            batch_id: Spark's batchId.
            records: (key, value) pairs for the sink topic.
            written: the driver's: the results the batch's sink tasks committed themselves (to
                the sink topic, to others); the transaction then holds the query's marker only.

        Returns:
            What was done; batches at or below the last committed batchId write nothing.

        Raises:
            TransactionAbortedError: the transaction was aborted; retrying the batch is safe.
            FatalKafkaError: fenced by a newer job, or a fatal error: this writer must stop.
        """
        batch = list(records)
        cached = self.started
        if cached and self._taken_over(batch_id):
            # Fenced for certain: re-initialise before producing (as below, minus the share
            # produced into a transaction the broker would refuse).
            self._stop_if_superseded(batch_id)
            logger.debug("batch %d: another worker committed since: re-initialising", batch_id)
            self._discard()
            self.start()
            return self._commit_once(batch_id, batch, written)
        try:
            return self._commit_once(batch_id, batch, written)
        except StaleSession as stale:
            # Another Python worker of this job committed since: re-read, then decide again.
            logger.debug("batch %d: %s; re-initialising to re-read it", batch_id, stale)
            self._discard()
            self.start()
            return self._commit_once(batch_id, batch, written)
        except FatalKafkaError as exc:
            if not cached or not is_fenced(exc):
                raise
        # Fenced since the last commit: by a newer start (stop once it committed: sink.fencing)
        # or by another Python worker of this job (Spark reuses workers; re-initialising re-reads
        # the marker, so a batch the fencer committed is skipped, never doubled).
        self._stop_if_superseded(batch_id)
        # Routine, not a warning: Spark runs a task in whichever of its Python workers is free,
        # and each keeps its own producer per transactional.id, so they fence each other in turn
        # (measured in a soak at one batch per second: about one re-initialisation per batch).
        logger.debug(
            "batch %d: producer for %s was fenced (by another worker of this job, or by a newer "
            "start that has committed nothing); re-initialising",
            batch_id,
            self.config.transactional_id,
        )
        self.start()
        # Fenced again within this one batch: another job is committing right now.
        return self._commit_once(batch_id, batch, written)

    def _taken_over(self, batch_id: int) -> bool:
        """Whether another worker of this job has committed this sink partition since this
        session's last commit, and so fenced its producer (it initialised after this session's
        producer, or this one could not have committed after it). Asked only of a sink task whose
        last commit is not the batch before: the other worker's turn, or batches with no results
        for the partition (then the progress topic says so, and the producer stays)."""
        cfg, last = self.config, self.last_committed
        if cfg.sink_partition is None or last is None or batch_id <= last + 1:
            return False
        newest = self._reads.read().newest(cfg.query_id, cfg.sink_partition)
        return newest is not None and newest.batch_id > last

    def _stop_if_superseded(self, batch_id: int) -> None:
        """Raise FatalKafkaError when a start announced after this one has committed a batch."""
        cfg = self.config
        theirs = self._reads.superseded_by()
        if theirs is None:
            return
        self._discard()
        raise FatalKafkaError(
            f"batch {batch_id}: fenced for good: a newer start of this query (run {theirs}) has "
            f"taken over transactional.id {cfg.transactional_id!r} (query {cfg.query_id}) and "
            f"committed: two jobs are using the same checkpoint. This one (run {cfg.run_id}) "
            "stops and does not fence it back; nothing of its batch was committed"
        )

    def _commit_once(
        self, batch_id: int, records: list[Record], written: tuple[int, int] | None = None
    ) -> CommitOutcome:
        """Commit one batch, or skip it: empty, or a replay of the last committed one."""
        started = time.monotonic()
        empty = not records and not (written and any(written))
        if not self.started and not (empty and self.config.sink_partition is not None):
            # Even for an empty batch of the driver's: init_transactions aborts what a crashed
            # predecessor left open, which would otherwise hold back read_committed readers (and
            # other queries' progress reads on the shared progress topic) until the broker times
            # it out. A sink task with nothing to write starts nothing: the job's start fenced
            # every task's id, and a task that writes nothing needs no marker to decide on.
            self.start()
        if empty:
            # No transaction and no marker: the marker only has to cover batches with output, and
            # a replay of an empty batch writes nothing either (idle triggers stay cheap).
            logger.debug("batch %d has no results: nothing to commit", batch_id)
            return CommitOutcome("empty", batch_id, 0, time.monotonic() - started)
        source_end, watermark_ms = batch_source_end(self.config.checkpoint, batch_id)
        if self.last_committed is not None and batch_id <= self.last_committed:
            self._skip_replay(batch_id, source_end)
            return CommitOutcome("replay", batch_id, 0, time.monotonic() - started)
        # The batch before this one must still be on the broker: never write over a lost commit.
        cfg = self.config
        check_still_committed(
            self._probe,
            cfg.progress_topic,
            self.last_marker,
            cfg.topic,
            batch_id,
            cfg.retry_deadline_seconds,
        )
        marker = self._write_transaction(batch_id, records, source_end, watermark_ms, written)
        producer = self._live_producer()
        self._call(
            "commit_transaction", lambda t: producer.commit_transaction(t), batch_id=batch_id
        )
        self._in_transaction = False
        self._committed(marker)
        seconds = time.monotonic() - started
        # One line per transaction, i.e. per sink task and batch: debug. The batch's line at info
        # is sink.task_commit's, where the driver's commit runs.
        logger.debug(
            "batch %d committed: %d records (+%d corrections) in %.3fs",
            batch_id,
            marker.records,
            marker.late_records or 0,
            seconds,
        )
        return CommitOutcome(
            "committed", batch_id, marker.records + (marker.late_records or 0), seconds
        )

    def _skip_replay(self, batch_id: int, source_end: JsonValue) -> None:
        """A batch at or below the last committed one writes nothing: with a checkpoint to
        compare with (every Spark job), only the very batch that was committed, over the same
        offsets, may be skipped (else SinkHistoryError)."""
        if self.config.checkpoint:
            check_replay(
                batch_id, source_end, self.last_marker, self.config.checkpoint, self.config.topic
            )
        elif self.config.sink_partition is not None and batch_id < (self.last_committed or 0):
            raise older_than_committed(self.config, batch_id, self.last_committed or 0)
        logger.info(
            "batch %d already committed (last committed %s): skipping the replay",
            batch_id,
            self.last_committed,
        )
        committed = 0 if self.last_marker is None else self.last_marker.records
        write_receipt(self.config.checkpoint, batch_id, committed, source_end)

    def _write_transaction(
        self,
        batch_id: int,
        records: list[Record],
        source_end: JsonValue,
        watermark_ms: int | None,
        written: tuple[int, int] | None = None,
    ) -> ProgressMarker:
        """Begin a transaction and write the batch's records and its progress marker into it,
        flushed (not committed). Returns the marker, with its position when it was delivered."""
        cfg = self.config
        producer = self._live_producer()
        self._call("begin_transaction", lambda _t: producer.begin_transaction())
        self._in_transaction = True
        try:
            count, late = self._produce_all(producer, records)
            if written is not None:
                count, late = count + written[0], late + written[1]
            marker = ProgressMarker(
                query_id=cfg.query_id,
                batch_id=batch_id,
                run_id=cfg.run_id,
                records=count,
                late_records=late,
                topic=cfg.topic,
                source_end=source_end,
                transactional_id=cfg.transactional_id,
                committed_at_ms=int(time.time() * 1000),
                # This batch's watermark: every window ending at or before it is emitted by now,
                # so `ipcount verify` tells windows still open from lost ones.
                watermark_ms=watermark_ms,
                sink_partition=cfg.sink_partition,
            )
            position: list[int] = []

            def _where(err: KafkaError | None, msg: Message) -> None:
                if err is None:
                    position.extend([msg.partition() or 0, msg.offset() or 0])

            produce(producer, cfg.progress_topic, marker.encode(), marker.key, on_delivery=_where)
            # commit_transaction flushes anyway; flushing first means that at sink.before_commit
            # the batch sits on the broker inside the open transaction (what a crash leaves).
            producer.flush(cfg.retry_deadline_seconds)
            if cfg.fault_points:
                fault_point("sink.before_commit", batch_id)
        except KafkaException as exc:
            self._fail_in_transaction(batch_id, "producing", exc)
        except BaseException:
            self._abort_quietly(batch_id)
            raise
        return marker.at(position[0], position[1]) if position else marker

    def _committed(self, marker: ProgressMarker) -> None:
        """After the broker acknowledged the commit: remember the marker (for the next batch's
        continuity check) and write the checkpoint's receipt."""
        batch_id = marker.batch_id
        self.last_committed = batch_id
        if marker.position is None:
            # No delivery report: the next batch cannot check that this one is still there.
            logger.warning("batch %d: no delivery report for its progress marker", batch_id)
        self.last_marker = marker
        records = marker.records + (marker.late_records or 0)
        write_receipt(self.config.checkpoint, batch_id, records, marker.source_end)
        if self.config.fault_points:
            fault_point("sink.after_commit", batch_id)

    def _produce_all(self, producer: Producer, records: Iterable[Record]) -> tuple[int, int]:
        """Produce every record; returns (records to the sink topic, records to other topics)."""
        topic = self.config.topic
        count = other = 0
        for record in records:
            headers = record[2] if len(record) > 2 else None
            target = record[3] if len(record) > 3 else topic
            produce(producer, target, record[1], record[0], headers)
            if target == topic:
                count += 1
            else:
                other += 1
        return count, other

    def _check_topics(self, producer: Producer) -> None:
        cfg = self.config
        try:
            # All topics, not named ones: asking for a named topic may auto-create it.
            md = producer.list_topics(timeout=min(cfg.retry_deadline_seconds, 30.0))
        except KafkaException as exc:
            raise SinkError(
                f"cannot read metadata from {cfg.producer_conf.get('bootstrap.servers')}",
                exc.args[0],
            ) from exc
        named = [(cfg.topic, "topic"), (cfg.progress_topic, "progressTopic")]
        if cfg.late_topic:
            named.append((cfg.late_topic, "lateTopic"))
        for name, setting in named:
            if name not in md.topics:
                raise ConfigError(
                    f"sink {setting} {name!r} does not exist: run `ipcount topics create` "
                    "(topics.sink / topics.progress / topics.late)"
                )

    def _read_progress(self) -> tuple[int | None, str]:
        """The last committed batchId of this query and the run id that committed it."""
        cfg = self.config
        view = self._reads.read()
        query = view.newest(cfg.query_id)
        if cfg.sink_partition is None:
            self.last_marker = query
        else:
            # A sink task's own marker (for the continuity check); a batch the query's marker
            # records is committed whole, whichever way it was written.
            self.last_marker = view.newest(cfg.query_id, cfg.sink_partition)
        newest = max(
            (m for m in (query, self.last_marker) if m is not None),
            key=lambda m: m.batch_id,
            default=None,
        )
        if newest is None:
            return None, ""
        return newest.batch_id, newest.run_id

    def close(self) -> None:
        """Drop the producer, and close the continuity probe's consumer."""
        super().close()
        self._probe.close()

    def _discard(self) -> None:
        # A fatal/fenced producer cannot be reused: the next commit re-inits with a new one and
        # re-reads the progress marker, so the outcome of an uncertain commit is decided by Kafka.
        super()._discard()
        self.last_committed = None
        self.last_marker = None
