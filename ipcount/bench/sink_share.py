"""What the sink's tasks did in a measured run, from the run's own topics and job log (bench
process side): the results that passed through the driver (the sink topic's records less those
the sink tasks' markers count, committed in the same transactions: 0 by design) and, per batch,
the slowest sink task's time to receive and encode its rows (the state store's work included:
rows come as they are computed) and its commit (the line sink.task_commit logs per batch)."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from ipcount.config import Settings
from ipcount.kafka.topic_reader import TopicReader
from ipcount.sink.marker import ProgressMarker
from ipcount.sink.runs import RUN_SUFFIX

__all__ = ["SinkShare", "TaskTimes", "sink_share", "task_marker_records", "task_times"]

# sink.task_commit.written_by's line (text log format).
_LINE = re.compile(
    r"batch (?P<batch>\d+): (?P<tasks>\d+) sink task\(s\) wrote (?P<records>\d+) records .*"
    r"slowest task: rows and encoding (?P<encode>[0-9.]+)s, commit (?P<commit>[0-9.]+)s"
)


@dataclass(frozen=True)
class TaskTimes:
    """The slowest sink task of each batch the job log has a line for: its seconds summed over
    those batches, and the largest (rows and encoding + commit) of one batch."""

    batches: int = 0
    rows_and_encoding_s: float = 0.0
    commit_s: float = 0.0
    worst_batch_s: float = 0.0


@dataclass(frozen=True)
class SinkShare:
    """The sink tasks' share of a run: results on the sink topic, those the sink tasks' own
    markers count, and the tasks' times."""

    sink_records: int
    task_records: int
    times: TaskTimes = TaskTimes()

    @property
    def through_driver(self) -> int:
        """Results not written by a sink task's transaction: the driver's (must be 0)."""
        return self.sink_records - self.task_records

    def line(self) -> str:
        t = self.times
        return (
            f"bench: sink results_through_driver={self.through_driver} (sink records "
            f"{self.sink_records}, of which the sink tasks' own markers count "
            f"{self.task_records}) slowest_task_s rows_and_encoding={t.rows_and_encoding_s:.1f} "
            f"commit={t.commit_s:.1f} worst_batch={t.worst_batch_s:.2f} over {t.batches} "
            "batches (per batch the slowest sink task, from the job log)"
        )


def task_marker_records(settings: Settings, deadline_seconds: float = 60.0) -> int:
    """The results the sink tasks' committed markers count, for the sink topic, summed over every
    marker of the progress topic (read_committed: markers of aborted transactions are not seen;
    the run's progress topic is its own)."""
    total = 0
    with TopicReader(
        settings.kafka.to_librdkafka("consumer"),
        settings.topics.progress,
        topic_setting="topics.progress",
    ) as reader:
        for rec in reader.read_to_end(deadline_seconds):
            if rec.key is not None and RUN_SUFFIX.encode() in rec.key:
                continue
            marker = ProgressMarker.decode(rec.value, where=rec.where)
            if marker.sink_partition is not None and marker.topic == settings.topics.sink:
                total += marker.records
    return total


def task_times(log_text: str) -> TaskTimes:
    """The slowest sink task's times of each batch the log has a line for."""
    batches, encode, commit, worst = 0, 0.0, 0.0, 0.0
    for m in _LINE.finditer(log_text):
        e, c = float(m["encode"]), float(m["commit"])
        batches, encode, commit, worst = batches + 1, encode + e, commit + c, max(worst, e + c)
    return TaskTimes(batches, encode, commit, worst)


def sink_share(settings: Settings, sink_records: int, log: Path) -> SinkShare:
    """The run's SinkShare (`sink_records`: the sink topic's records, as verify read them)."""
    try:
        text = log.read_text(errors="replace")
    except OSError:
        text = ""
    return SinkShare(sink_records, task_marker_records(settings), task_times(text))
