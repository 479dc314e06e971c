"""The `ipcount-kafka` streaming source's reader (`spark.readStream.format("ipcount-kafka")`): the
driver plans micro-batches from Kafka offsets, executors read them (the options:
source.data_source.KafkaDataSource)."""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator, Sequence
from typing import Any

from confluent_kafka import KafkaException
from pyspark.sql.datasource import DataSourceStreamReader, InputPartition
from pyspark.sql.streaming.datasource import (
    ReadAllAvailable,
    ReadLimit,
    ReadMaxRows,
    SupportsTriggerAvailableNow,
)

from ipcount.errors import SourceError
from ipcount.source.clean_ranges import prune_passed, prune_retired
from ipcount.source.counted_batches import (
    CountedBatch,
    keep_first_offsets,
    prune_counted,
    record_batch,
)
from ipcount.source.data_loss import check_data_loss
from ipcount.source.follow import CountsFollower, follower_start, plan_followed, unread_clean
from ipcount.source.heartbeats import HeartbeatPlanner
from ipcount.source.offsets import (
    EARLIEST,
    LATEST,
    OffsetRange,
    SourceOffset,
    TopicPartitionKey,
    lag_report,
    spread_limit,
)
from ipcount.source.options import SourceOptions
from ipcount.source.pacing import Admission
from ipcount.source.task_plan import plan_tasks

__all__ = ["KafkaStreamReader", "KafkaInputPartition"]

logger = logging.getLogger(__name__)


class KafkaInputPartition(InputPartition):
    """One Spark task: an offset range of one topic partition (and, for the counting query,
    `more` ranges read one after the other: source.task_plan), and/or the
    batch's heartbeat; `late_before_ms`: the batch's watermark for late records (None: unknown);
    `batch_ms`: the batch's time from the offset log (None: unknown), which bounds event times
    (future)."""

    def __init__(
        self,
        rng: OffsetRange | None,
        heartbeat_ms: int | None = None,
        late_before_ms: int | None = None,
        batch_ms: int | None = None,
        more: tuple[OffsetRange, ...] = (),
    ) -> None:
        super().__init__((rng, heartbeat_ms, late_before_ms, batch_ms, more))
        self.range = rng
        self.heartbeat_ms = heartbeat_ms
        self.late_before_ms = late_before_ms
        self.batch_ms = batch_ms
        self.more = more

    @property
    def ranges(self) -> tuple[OffsetRange, ...]:
        """Every offset range this task reads."""
        return () if self.range is None else (self.range, *self.more)

    def __repr__(self) -> str:
        more = f", more={self.more!r}" if self.more else ""
        return (
            f"KafkaInputPartition({self.range!r}, heartbeat_ms={self.heartbeat_ms}, "
            f"late_before_ms={self.late_before_ms}, batch_ms={self.batch_ms}{more})"
        )


class KafkaStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """Plans micro-batches on the driver from Kafka offsets; reads offset ranges on executors."""

    def __init__(self, options: SourceOptions) -> None:
        self.options = options
        self._reset_driver_state()

    def _reset_driver_state(self) -> None:
        # Driver-only state: clients are created on first use, never pickled.
        self._kafka: Any = None
        self._target: dict[TopicPartitionKey, int] | None = None
        self._report: dict[str, Any] | None = None
        self._planner: HeartbeatPlanner | None = None
        opts = self.options
        self._admission = Admission(
            opts.min_batch_interval_ms, opts.window_ms, opts.watermark_delay_ms, self._peek_tails
        )
        self._follower = (
            CountsFollower(self.options.counts_checkpoint)
            if self.options.counts_checkpoint
            else None
        )

    def __getstate__(self) -> dict[str, Any]:
        return {"options": self.options}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.options = state["options"]
        self._reset_driver_state()

    @property
    def _offsets(self) -> Any:
        if self._kafka is None:
            from ipcount.source.offset_reader import KafkaOffsetReader

            self._kafka = KafkaOffsetReader(self.options)
        return self._kafka

    @property
    def _heartbeats(self) -> HeartbeatPlanner:
        if self._planner is None:
            self._planner = HeartbeatPlanner(self.options, self._offsets)
        return self._planner

    # --- driver ---------------------------------------------------------------------------

    def initialOffset(self) -> dict[str, Any]:
        opts = self.options
        if opts.counts_checkpoint:
            # Dead letters start where the counting query's known batches start (follow).
            found = follower_start(opts.counts_checkpoint)
            if found is not None:
                return SourceOffset(found).to_json()
        resolved = self._starting_offsets()
        if opts.clean_range_markers and opts.query_checkpoint:
            # A counting query with dead letters keeps its first offsets: the dead-letter query
            # starts there, and a replay of its first batch starts there too.
            return keep_first_offsets(opts.query_checkpoint, resolved)
        return SourceOffset(resolved).to_json()

    def _starting_offsets(self) -> dict[TopicPartitionKey, int]:
        parts = self._offsets.partitions()
        wanted = self.options.starting_offsets
        if wanted in ("earliest", "latest"):
            return dict(self._offsets.offsets(parts, wanted))
        if not isinstance(wanted, dict):
            raise SourceError(f"startingOffsets={wanted!r} is not understood")
        missing = [f"{t}/{p}" for t, p in parts if (t, p) not in wanted]
        unknown = [f"{t}/{p}" for t, p in sorted(wanted) if (t, p) not in parts]
        if missing or unknown:
            raise SourceError(
                "startingOffsets JSON must name every partition of the subscribed topics"
                + (f"; missing: {', '.join(missing)}" if missing else "")
                + (f"; not existing: {', '.join(unknown)}" if unknown else "")
            )
        resolved = dict(wanted)
        for mark, where in ((EARLIEST, "earliest"), (LATEST, "latest")):
            resolved.update(
                self._offsets.offsets([tp for tp in parts if wanted[tp] == mark], where)
            )
        return resolved

    def getDefaultReadLimit(self) -> ReadLimit:
        if self.options.max_offsets_per_trigger:
            return ReadMaxRows(self.options.max_offsets_per_trigger)
        return ReadAllAvailable()

    def prepareForTriggerAvailableNow(self) -> None:
        # Everything up to the current end is this run's work; later records wait for the next run.
        self._target = self._offsets.offsets(self._offsets.partitions(), "latest")
        logger.info("Trigger.AvailableNow: reading up to %s", self._target)

    def latestOffset(self, start: dict[str, Any], limit: ReadLimit) -> dict[str, Any]:
        begin = SourceOffset.from_json(start)
        parts = self._offsets.partitions()
        latest = self._offsets.offsets(parts, "latest")
        earliest = self._offsets.offsets(parts, "earliest")
        effective = check_data_loss(
            self.options, self._offsets, begin.offsets, parts, earliest, latest
        )
        available = latest
        if self._target is not None:
            # Partitions created after prepareForTriggerAvailableNow wait for the next run.
            available = {tp: min(latest[tp], self._target.get(tp, effective[tp])) for tp in parts}
        available = {tp: max(available[tp], effective[tp]) for tp in parts}
        if isinstance(limit, ReadMaxRows):
            end = spread_limit(effective, available, limit.max_rows)
        elif isinstance(limit, ReadAllAvailable):
            end = available
        else:
            raise SourceError(f"ipcount-kafka does not support the read limit {limit!r}")
        verdicts = None
        if self._follower is not None:
            end, verdicts = self._follower.follow(begin.offsets, end)
            # Batches before `start` are done: their unused clean-range markers and records go.
            prune_passed(self._follower.checkpoint, begin.offsets)
            prune_counted(self._follower.checkpoint, begin.offsets)
        self._report = lag_report(latest, end)
        now = self._target is not None
        if any(end[tp] > begin.offsets.get(tp, 0) for tp in end):
            if not now and not self._admission.admits(time.monotonic(), end):
                # New records wait for the batch interval; Spark runs a batch now only if the
                # watermark the last batch moved still has windows to emit.
                self._report = lag_report(latest, begin.offsets)
                return start
            self._heartbeats.records_read()
            flush = self._heartbeats.final_flush(end, available, now)
            return SourceOffset(end, flush, verdicts).to_json()
        if end != begin.offsets:
            # Partitions appeared or vanished, but no new records: keep the idle clock running.
            return SourceOffset(end, begin.heartbeat).to_json()
        heartbeat = self._heartbeats.next(begin, latest, now) if self.options.heartbeats else None
        if heartbeat is None:
            return start
        logger.info("source idle: heartbeat %d at event time %d ms", heartbeat.seq, heartbeat.ts)
        return SourceOffset(begin.offsets, heartbeat).to_json()

    def _peek_tails(self, end: dict[TopicPartitionKey, int]) -> int | None:
        try:
            newest: int | None = self._offsets.tail_event_ms(end, int(time.time() * 1000))
            return newest
        except (SourceError, KafkaException) as exc:  # a hint: the batch interval decides instead
            logger.debug("no look at the tails for pacing: %s", exc)
            return None

    def reportLatestOffset(self) -> dict[str, Any] | None:
        return self._report

    def partitions(self, start: dict[str, Any], end: dict[str, Any]) -> Sequence[InputPartition]:
        begin, finish = SourceOffset.from_json(start), SourceOffset.from_json(end)
        for tp, pos in finish.offsets.items():
            if pos < begin.offsets.get(tp, 0):
                logger.warning(
                    "skipping %s/%d: offset moved back from %d to %d", *tp, begin.offsets[tp], pos
                )
        opts = self.options
        split = (opts.min_partitions, opts.max_records_per_partition, opts.min_split_records)
        late_before, batch_ms, batch_id = self._batch_marks(end)
        if finish.verdicts is not None:
            # Dead letters: each record judged at the time of the counting batch that read it.
            followed = plan_followed(begin.offsets, finish.offsets, finish.verdicts, *split)
            if self.options.counts_checkpoint:
                skew = self.options.max_future_skew_ms
                followed = unread_clean(followed, self.options.counts_checkpoint, skew)
            tasks = [
                KafkaInputPartition(rng, None, late_before, judged or None)
                for rng, judged in followed
            ]
        else:
            if opts.clean_range_markers and batch_id is not None:
                # What the dead-letter query needs of this batch, past Spark's offset-log purge.
                batch = CountedBatch(batch_id, begin.offsets, finish.offsets, batch_ms or 0)
                record_batch(opts.query_checkpoint, batch)
            tasks = [
                KafkaInputPartition(group[0], None, late_before, batch_ms, tuple(group[1:]))
                for group in plan_tasks(begin.offsets, finish.offsets, *split)
            ]
        hb = finish.heartbeat
        if hb is not None and hb != begin.heartbeat:
            if tasks:
                first = tasks[0]
                tasks[0] = KafkaInputPartition(
                    first.range, hb.ts, late_before, batch_ms, first.more
                )
            else:
                tasks = [KafkaInputPartition(None, hb.ts, late_before, batch_ms)]
        return tasks

    def _batch_marks(self, end: dict[str, Any]) -> tuple[int | None, int | None, int | None]:
        """(the watermark this batch's late records are judged by, the batch's time, its id), all
        from the offset log (see checkpoint.offset_log), or None without option queryCheckpoint.
        A replayed batch reads the same entry, so it decides lateness and future the same."""
        if not self.options.query_checkpoint:
            return None, None, None
        from ipcount.checkpoint.offset_log import OffsetLog

        marks = OffsetLog(self.options.query_checkpoint).watermarks_for(end)
        logger.debug(
            "batch %d: late before %d ms (watermark %d ms), batch time %d ms",
            marks.batch_id,
            marks.late_before_ms,
            marks.watermark_ms,
            marks.batch_timestamp_ms,
        )
        return marks.late_before_ms, marks.batch_timestamp_ms or None, marks.batch_id

    def commit(self, end: dict[str, Any]) -> None:
        # Offsets live in Spark's checkpoint; nothing is committed to Kafka. Clean-range markers
        # of batches Spark no longer keeps go.
        if self.options.clean_range_markers:
            prune_retired(self.options.query_checkpoint)

    def stop(self) -> None:
        if self._kafka is not None:
            self._kafka.close()
            self._kafka = None

    # --- executors ------------------------------------------------------------------------

    def read(self, partition: InputPartition) -> Iterator[Any]:
        from ipcount.worker_gc import freeze_long_lived

        freeze_long_lived()
        if not isinstance(partition, KafkaInputPartition):
            raise SourceError(f"ipcount-kafka cannot read partition {partition!r}")
        if self.options.output != "records":
            from ipcount.source.counting_task import read_task

            yield from read_task(
                self.options,
                partition.ranges,
                partition.heartbeat_ms,
                partition.late_before_ms,
                partition.batch_ms,
            )
            return
        from ipcount.source.partition_reader import heartbeat_batch, read_range

        late_before = partition.late_before_ms
        if partition.heartbeat_ms is not None:
            topic = sorted(self.options.topics)[0]
            yield heartbeat_batch(topic, partition.heartbeat_ms, late_before)
        for rng in partition.ranges:
            yield from read_range(self.options, rng, late_before_ms=late_before)
