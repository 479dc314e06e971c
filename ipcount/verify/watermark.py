"""How far the job that wrote the sink has emitted: the watermark recorded in its progress
markers (what a reader with only Kafka access has), else in its checkpoint. Driver/CLI side
(`ipcount verify`)."""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping
from dataclasses import dataclass

from ipcount.checkpoint.offset_log import OffsetLog, local_path
from ipcount.config import Settings
from ipcount.errors import IpcountError
from ipcount.sink.history import read_markers
from ipcount.sink.marker import ProgressMarker

__all__ = ["SinkWatermark", "checkpoint_watermark", "marker_watermark", "sink_watermark"]


@dataclass(frozen=True)
class SinkWatermark:
    """How far the job has emitted: Spark emits a window (append mode) once its end is at or
    before the watermark, so a window ending at or before `ms` is closed and one ending after it
    is still open in the job's state. `source` says where the figure was read."""

    ms: int
    source: str

    def closes(self, window_end_ms: int) -> bool:
        """Whether the job has emitted every window ending at this time."""
        return window_end_ms <= self.ms

    def __str__(self) -> str:
        when = dt.datetime.fromtimestamp(self.ms / 1000, tz=dt.UTC)
        return f"{when.isoformat(timespec='milliseconds').replace('+00:00', 'Z')} ({self.source})"


def marker_watermark(markers: Mapping[str, ProgressMarker], topic: str) -> SinkWatermark | None:
    """The highest watermark among the newest progress markers of the queries that wrote `topic`
    (None: no marker of it records one; markers of older ipcount versions have no watermark).
    A query's marker is committed after every sink task committed its share of the batch, so
    every window ending at or before its watermark is in the sink (or in a correction)."""
    best: SinkWatermark | None = None
    for qid, marker in markers.items():
        mark = marker.watermark_ms
        if marker.topic != topic or mark is None:
            continue
        if best is None or mark > best.ms:
            best = SinkWatermark(mark, f"progress marker of query {qid} batch {marker.batch_id}")
    return best


def checkpoint_watermark(
    checkpoint: str, markers: Mapping[str, ProgressMarker], topic: str
) -> SinkWatermark | None:
    """The watermark of the newest batch in a local checkpoint's commit log, when that checkpoint
    is the one of a query that wrote `topic` (its metadata id names a marker's query); else
    None. Spark writes its commit log after the sink's commit, so this may lag the sink."""
    if local_path(checkpoint) is None:
        return None
    try:
        log = OffsetLog(checkpoint)
        qid = log.query_id()
        marker = markers.get(qid) if qid is not None else None
        if marker is None or marker.topic != topic:
            return None
        last = log.last_committed()
        if last is None:
            return None
        mark = log.entry(last)[0].get("batchWatermarkMs")
    except (OSError, ValueError, KeyError, TypeError, IpcountError):
        return None
    if not isinstance(mark, int):
        return None
    return SinkWatermark(mark, f"checkpoint {checkpoint} batch {last}")


def sink_watermark(
    settings: Settings, checkpoint: str | None, deadline_seconds: float
) -> tuple[SinkWatermark | None, str]:
    """How far the job that wrote topics.sink has emitted: from its progress markers (what a
    reader with only Kafka access has), else from `checkpoint` (default job.checkpoint_location).

    Returns:
        (watermark, "") or (None, why it is unknown).
    """
    conf = settings.kafka.to_librdkafka("consumer")
    try:
        markers = read_markers(conf, settings.topics.progress, deadline_seconds)
    except IpcountError as exc:
        return None, f"cannot read topics.progress ({exc})"
    found = marker_watermark(markers, settings.topics.sink)
    if found is not None:
        return found, ""
    location = checkpoint or settings.job.checkpoint_location
    found = checkpoint_watermark(location, markers, settings.topics.sink)
    if found is not None:
        return found, ""
    return None, (
        f"no progress marker in {settings.topics.progress} records a watermark for "
        f"{settings.topics.sink} (written by an older ipcount, or nothing committed yet) and "
        f"the checkpoint {location} holds no committed batch of a query that wrote it (pass "
        "--checkpoint DIR)"
    )
