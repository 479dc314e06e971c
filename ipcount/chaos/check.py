"""Evidence of what each injected fault did, read from Spark's checkpoint and the sink's progress
topic (in the `ipcount chaos` process): right after the crash, and again at the end of the run."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

from ipcount.chaos.plan import AFTER_COMMIT, BEFORE_COMMIT, ChaosEvent
from ipcount.chaos.processes import batch_ids
from ipcount.config import Settings
from ipcount.errors import IpcountError
from ipcount.kafka.topic_reader import TopicReader
from ipcount.sink.marker import ProgressMarker

__all__ = ["query_id", "progress_markers", "crash_evidence", "confirm_faults"]


def query_id(checkpoint: str | Path) -> str | None:
    """The query id in a local checkpoint's `metadata` file (None before the first start)."""
    try:
        text = (Path(checkpoint) / "metadata").read_text(encoding="utf-8")
        return str(json.loads(text.splitlines()[0])["id"])
    except (OSError, ValueError, KeyError, IndexError):
        return None


def progress_markers(settings: Settings, query: str, isolation: str) -> Counter[int]:
    """How many progress markers of `query` per batch id a reader with `isolation` sees.

    With read_uncommitted this includes markers of open and aborted transactions (a
    read_committed reader would wait behind an open one).

    Raises:
        SinkError: a record under the query's key is not a progress marker.
    """
    seen: Counter[int] = Counter()
    with TopicReader(
        settings.kafka.to_librdkafka("consumer"),
        settings.topics.progress,
        isolation=isolation,
        topic_setting="topics.progress",
    ) as reader:
        for rec in reader.read_to_end(30):
            if rec.key == query.encode():
                seen[ProgressMarker.decode(rec.value, where=rec.where).batch_id] += 1
    return seen


def crash_evidence(settings: Settings, checkpoint: Path, kind: str, batch: int) -> str:
    """What Spark's commit log and Kafka hold for `batch` right after a fault point's crash."""
    logged = "in" if batch in batch_ids(checkpoint / "commits") else "not in"
    text = f"batch {logged} Spark's commit log"
    query = query_id(checkpoint)
    if query is None:
        return text
    try:
        if kind == AFTER_COMMIT:
            # No transaction is open after the commit: read_committed reads to the end.
            seen = progress_markers(settings, query, "read_committed")
            where = "committed in Kafka" if seen[batch] else "NOT committed in Kafka"
        else:
            # read_committed would wait behind the open transaction: look at it uncommitted.
            seen = progress_markers(settings, query, "read_uncommitted")
            where = "marker in an open transaction" if seen[batch] else "no marker in Kafka"
    except IpcountError as exc:
        return f"{text}; progress topic unreadable: {exc}"
    return f"{text}, {where}"


def confirm_faults(
    settings: Settings, checkpoint: Path, events: list[ChaosEvent]
) -> tuple[list[str], list[str]]:
    """Check, once the run is over, that each fired fault point left what it should have.

    sink.before_commit@N: the killed transaction was aborted, so batch N has two markers for
    read_uncommitted (the aborted one and the replay's) and one for read_committed.
    sink.after_commit@N: the commit stood and the restarted job skipped the replay: one marker.

    Returns:
        (confirmations, problems), one line per fault.
    """
    fired = [e for e in events if e.kind in (BEFORE_COMMIT, AFTER_COMMIT) and e.injected]
    query = query_id(checkpoint)
    if not fired or query is None:
        return [], []
    committed = progress_markers(settings, query, "read_committed")
    everything = progress_markers(settings, query, "read_uncommitted")
    good, bad = [], []
    for ev in fired:
        n = ev.batch if ev.batch is not None else -1
        c, u = committed[n], everything[n]
        if ev.kind == BEFORE_COMMIT and c == 1 and u >= 2:
            good.append(f"{ev.kind}@{n}: transaction aborted, batch rewritten once by the restart")
        elif ev.kind == AFTER_COMMIT and c == 1 and u == 1:
            good.append(f"{ev.kind}@{n}: commit stood, the restart skipped the replay")
        else:
            bad.append(
                f"{ev.kind}@{n}: progress markers committed={c} all={u}: the crash did not leave "
                "what this fault point should"
            )
    return good, bad
