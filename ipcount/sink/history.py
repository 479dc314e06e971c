"""The sink's committed history (progress markers and run announcements on topics.progress)
against Spark's checkpoint (driver): what stops a job instead of counting twice or skipping."""

from __future__ import annotations

import datetime as dt
import json
import logging
from collections.abc import Iterable, Mapping
from typing import Protocol

from ipcount.checkpoint.offset_log import OffsetLog, local_path
from ipcount.checkpoint.receipts import ReceiptLog
from ipcount.errors import SinkHistoryError
from ipcount.sink.marker import JsonValue, ProgressMarker
from ipcount.sink.runs import (
    RUN_SUFFIX,
    announce_run,
    produce_one,
    read_progress,
    run_order,
)

__all__ = [
    "RUN_SUFFIX",
    "CommittedBatch",
    "adopt",
    "announce_run",
    "run_order",
    "read_markers",
    "check_checkpoint",
    "check_replay",
    "lost_commit",
    "other_query_output",
    "starting_offsets_after",
]

logger = logging.getLogger(__name__)


def adopt(
    producer_conf: Mapping[str, str],
    progress_topic: str,
    query_id: str,
    run_id: str,
    other: ProgressMarker,
) -> None:
    """Give a new query (`--new-query`) the history it starts from: a marker of batch -1 that
    ends where `other`'s output ends, so later starts know this query and its offsets.

    Raises:
        SinkError: the broker did not acknowledge the record.
    """
    marker = ProgressMarker(
        query_id=query_id,
        batch_id=-1,
        run_id=run_id,
        records=0,
        topic=other.topic,
        source_end=other.source_end,
        adopted_from=other.query_id,
        committed_at_ms=int(dt.datetime.now(tz=dt.UTC).timestamp() * 1000),
    )
    produce_one(producer_conf, progress_topic, [(query_id, marker.encode())])


def read_markers(
    consumer_conf: Mapping[str, str], progress_topic: str, deadline_seconds: float
) -> dict[str, ProgressMarker]:
    """The newest committed progress marker of every query id (read_committed).

    Each progress marker (topics.progress, key = query id, compacted) says what one committed
    batch wrote and consumed (sink.marker).

    Raises:
        SinkError: a marker of the topic is not ipcount's.
    """
    return read_progress(consumer_conf, progress_topic, deadline_seconds).markers


class CommittedBatch(Protocol):
    """What a committed batch is known by: a progress marker, or the checkpoint's receipt."""

    @property
    def batch_id(self) -> int: ...
    @property
    def records(self) -> int: ...
    @property
    def source_end(self) -> JsonValue: ...
    @property
    def committed_at_ms(self) -> int | None: ...


def _when(batch: CommittedBatch) -> str:
    ms = batch.committed_at_ms
    if ms is None:
        return "at an unknown time"
    return "at " + dt.datetime.fromtimestamp(ms / 1000, tz=dt.UTC).isoformat(timespec="seconds")


def _offsets(value: JsonValue) -> str:
    if isinstance(value, dict) and "offsets" in value:
        value = value["offsets"]
    return json.dumps(value, sort_keys=True)


def _same_content(a: JsonValue, b: JsonValue) -> bool:
    """Two batches consumed the same records: equal source end offsets (heartbeats aside)."""
    if isinstance(a, dict) and isinstance(b, dict):
        return a.get("offsets") == b.get("offsets")
    return bool(a == b)


def check_checkpoint(marker: ProgressMarker | None, checkpoint: str, topic: str) -> None:
    """At start: the query's newest marker (None: it has none) against its checkpoint and the
    sink's receipts there (checkpoint.receipts). Disagreements stop the job with a message that
    names both sides and how to recover, instead of counting anything twice or skipping it:

    - lost commit: a receipt newer than the query's newest marker (the broker acknowledged that
      commit and lost it);
    - older checkpoint: Spark has not planned the sink's newest committed batch yet, or planned a
      batch with that id over other offsets (a restored copy).

    (A third, another query's output on the sink topic, is `other_query_output`.)

    Raises:
        SinkHistoryError: a lost commit, or a checkpoint older than the sink's history.
    """
    if local_path(checkpoint) is None:
        logger.info("checkpoint %s is not local: receipts are not kept", checkpoint)
        receipts = []
    else:
        receipts = ReceiptLog(checkpoint).newer_than(None if marker is None else marker.batch_id)
    if receipts:
        have = "none" if marker is None else f"batch {marker.batch_id}"
        raise lost_commit(
            topic,
            receipts[0],
            f"the newest progress marker the broker now has for this query is {have}"
            + (f" (source offsets {_offsets(marker.source_end)})" if marker else "")
            + f"; {len(receipts)} acknowledged batch(es) are missing",
            f"delete the receipts in {checkpoint}/ipcount-sink newer than that batch and ",
        )
    if marker is None or marker.batch_id < 0:
        return  # nothing committed yet (a --new-query start's marker ends before batch 0)
    try:
        log = OffsetLog(checkpoint)
        planned = log.batch_ids()
    except Exception as exc:  # a checkpoint Python cannot read: the commit-time check remains
        logger.info(
            "cannot read the offset log of %s (%s): skipping the start check", checkpoint, exc
        )
        return
    batch = marker.batch_id
    if not planned or planned[-1] < batch:
        newest = planned[-1] if planned else None
        raise _older(checkpoint, topic, marker, newest)
    if batch in planned and marker.source_end is not None:
        mine = log.source_end(batch)
        if mine is not None and not _same_content(mine, marker.source_end):
            raise _different(checkpoint, topic, marker, batch, mine)


def lost_commit(
    topic: str, lost: CommittedBatch, found: str, receipts: str = ""
) -> SinkHistoryError:
    """The error for a commit the broker acknowledged and no longer has: `lost` is what was
    committed (its marker or receipt), `found` what the broker has instead, `receipts` what to do
    with the checkpoint's receipts of it, if any."""
    return SinkHistoryError(
        f"the broker lost a committed batch of {topic!r}: batch {lost.batch_id} "
        f"({lost.records} records, source offsets {_offsets(lost.source_end)}) "
        f"was acknowledged as committed {_when(lost)}, but {found}. The job stops rather than "
        "write on over the hole. Recover the broker's data (replicas, backups), or re-count "
        "from the last batch the broker has: restore the checkpoint copy that matches it, or "
        f"{receipts}start with `--new-query` on a new checkpoint"
    )


def check_replay(
    batch_id: int,
    source_end: JsonValue,
    marker: ProgressMarker | None,
    checkpoint: str,
    topic: str,
) -> None:
    """A batch at or below the newest committed one is about to be skipped as a replay: only the
    very batch the sink committed, with the same source offsets, may be.

    Raises:
        SinkHistoryError: an older batch, or the same batch id over other offsets.
    """
    if marker is None:
        return
    if batch_id < marker.batch_id:
        raise _older(checkpoint, topic, marker, batch_id, running=True)
    theirs = marker.source_end
    if source_end is not None and theirs is not None and not _same_content(source_end, theirs):
        raise _different(checkpoint, topic, marker, batch_id, source_end)


def _older(
    checkpoint: str,
    topic: str,
    marker: ProgressMarker,
    spark_batch: int | None,
    running: bool = False,
) -> SinkHistoryError:
    """`running`: found while the query runs (a commit), where a second process writing the same
    checkpoint is the likelier cause than a restored older checkpoint."""
    at = "has planned no batch" if spark_batch is None else f"is at batch {spark_batch}"
    twin = (
        "If another process runs this query on the same checkpoint, stop one of them: this one "
        "stops here and writes nothing. Otherwise restore"
        if running
        else "Restore"
    )
    return SinkHistoryError(
        f"the checkpoint {checkpoint} is older than the sink's history: Spark {at}, but "
        f"{topic!r} already holds this query's batch {marker.batch_id} (source offsets "
        f"{_offsets(marker.source_end)}, committed {_when(marker)}). Replaying would skip "
        f"batches whose content differs from what was committed. {twin} the newest checkpoint "
        "of this query, or start a new query on a new checkpoint with `--new-query`"
    )


def _different(
    checkpoint: str, topic: str, marker: ProgressMarker, batch: int, mine: JsonValue
) -> SinkHistoryError:
    return SinkHistoryError(
        f"the checkpoint {checkpoint} does not match the sink's history: its batch {batch} "
        f"consumed source offsets {_offsets(mine)}, but the batch {marker.batch_id} committed "
        f"to {topic!r} {_when(marker)} consumed {_offsets(marker.source_end)}. This "
        "checkpoint is older than the sink's history or belongs to another run. Restore the "
        "newest checkpoint of this query, or start a new query on a new checkpoint with "
        "`--new-query`"
    )


def other_query_output(
    markers: Mapping[str, ProgressMarker],
    query_id: str,
    topic: str,
    source_topics: Iterable[str],
) -> ProgressMarker | None:
    """The newest marker of another query that wrote `topic` from any of `source_topics` (None
    when there is none). Markers without a topic or source offsets (older ipcount) are not judged.

    When this query has no output of its own, such a marker means a deleted or replaced
    checkpoint, or a second job: `--new-query` starts this one at that query's last committed
    source offsets instead (`starting_offsets_after`)."""
    wanted = set(source_topics)
    found: ProgressMarker | None = None
    for qid, marker in markers.items():
        if qid == query_id or marker.topic != topic:
            continue
        if not set(_source_offsets(marker)) & wanted:
            continue
        if found is None or (marker.committed_at_ms or 0) > (found.committed_at_ms or 0):
            found = marker
    return found


def _source_offsets(marker: ProgressMarker) -> dict[str, JsonValue]:
    """The marker's source offsets per topic ({"topic": {"0": n}}; empty when it has none)."""
    end = marker.source_end
    offsets = end.get("offsets") if isinstance(end, dict) else None
    return offsets if isinstance(offsets, dict) else {}


def starting_offsets_after(marker: ProgressMarker) -> str:
    """startingOffsets JSON ({"topic": {"0": n}}) at the end of a marker's batch."""
    offsets = _source_offsets(marker)
    if not offsets:
        raise SinkHistoryError(
            f"the progress marker of query {marker.query_id} holds no source offsets"
        )
    return json.dumps(offsets, sort_keys=True)


def refuse_new_query(
    other: ProgressMarker, query_id: str, topic: str, checkpoint: str
) -> SinkHistoryError:
    """The error for a new query on a sink that holds another query's output."""
    return SinkHistoryError(
        f"{topic!r} already holds the output of query {other.query_id} (its batch "
        f"{other.batch_id} committed {_when(other)}, source offsets "
        f"{_offsets(other.source_end)}) from the same source, but the checkpoint "
        f"{checkpoint} belongs to a new query ({query_id}): it would count the source again from "
        "job.starting_offsets and duplicate those windows. Point job.checkpoint_location at "
        "that query's checkpoint, or start this new query where that output ends with "
        "`ipcount run --new-query` (windows still open in the old query's state when it "
        "stopped then get only their later records)"
    )
