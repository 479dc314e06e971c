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
from ipcount.sink.marker import PARTITION_KEY_SEPARATOR, ProgressMarker, marker_key

__all__ = [
    "Slot",
    "query_id",
    "progress_markers",
    "after_commit_evidence",
    "crash_evidence",
    "confirm_faults",
]

# Whose marker and which batch: (sink partition, None for the query's own marker; batch id).
Slot = tuple[int | None, int]


def query_id(checkpoint: str | Path) -> str | None:
    """The query id in a local checkpoint's `metadata` file (None before the first start)."""
    try:
        text = (Path(checkpoint) / "metadata").read_text(encoding="utf-8")
        return str(json.loads(text.splitlines()[0])["id"])
    except (OSError, ValueError, KeyError, IndexError):
        return None


def progress_markers(settings: Settings, query: str, isolation: str) -> Counter[Slot]:
    """How many progress markers of `query` per (sink partition, batch id) a reader with
    `isolation` sees: partition None is the query's own marker (the driver's record of the
    batch), a number a sink task's (the faults strike inside the tasks' transactions).

    With read_uncommitted this includes markers of open and aborted transactions (a
    read_committed reader would wait behind an open one).

    Raises:
        SinkError: a record under the query's keys is not a progress marker.
        IpcountError: the topic did not reach its end within 30 s.
    """
    with _reader(settings, isolation) as reader:
        found = _marker_offsets(reader, query)
    return Counter({slot: len(places) for slot, places in found.items()})


def _reader(settings: Settings, isolation: str) -> TopicReader:
    return TopicReader(
        settings.kafka.to_librdkafka("consumer"),
        settings.topics.progress,
        isolation=isolation,
        topic_setting="topics.progress",
    )


def _marker_offsets(
    reader: TopicReader, query: str, until: dict[int, int] | None = None
) -> dict[Slot, list[tuple[int, int]]]:
    """Where (partition, offset) each marker of `query` lies, per slot, as `reader` sees (with
    `until`, only the records before those offsets)."""
    seen: dict[Slot, list[tuple[int, int]]] = {}
    mine = marker_key(query)
    tasks = mine + PARTITION_KEY_SEPARATOR.encode()
    for rec in reader.read_to_end(30, until=until):
        if until is not None and rec.offset >= until[rec.partition]:
            continue
        if rec.key == mine or (rec.key or b"").startswith(tasks):
            marker = ProgressMarker.decode(rec.value, where=rec.where)
            slot = (marker.sink_partition, marker.batch_id)
            seen.setdefault(slot, []).append((rec.partition, rec.offset))
    return seen


def after_commit_evidence(settings: Settings, query: str, batch: int) -> str:
    """Whether a sink task's marker of `batch` is committed, right after a crash that followed
    a task's commit.

    Other transactions may be open then (tasks of other partitions, or of the dead-letter query,
    killed with the job), and only the restart's fencing ends them: a read_committed read to the
    end would wait behind them. So the read stops at the last stable offset, below which every
    transaction is decided. A marker of `batch` past it is undecided as yet; `confirm_faults`
    settles it at the end of the run.
    """
    with _reader(settings, "read_committed") as reader:
        stable = reader.ends()
        committed = _marker_offsets(reader, query, until=stable)
    if any(p is not None and b == batch for p, b in committed):
        return _where(Counter(committed.keys()), batch, "committed in Kafka", "")
    with _reader(settings, "read_uncommitted") as reader:
        everything = _marker_offsets(reader, query)
    undecided = Counter(
        slot
        for slot, places in everything.items()
        if slot[1] == batch and any(offset >= stable.get(part, 0) for part, offset in places)
    )
    return _where(
        undecided,
        batch,
        "marker in Kafka behind another task's open transaction, its commit confirmed at the end",
        "NOT committed in Kafka",
    )


def _where(seen: Counter[Slot], batch: int, yes: str, no: str) -> str:
    """`yes`/`no`: whether a sink task's marker of `batch` is seen (naming the tasks that have
    one)."""
    tasks = sorted(p for p, b in seen if p is not None and b == batch)
    return f"{yes} (sink task {', '.join(map(str, tasks))})" if tasks else no


def crash_evidence(settings: Settings, checkpoint: Path, kind: str, batch: int) -> str:
    """What Spark's commit log and Kafka hold for `batch` right after a fault point's crash."""
    logged = "in" if batch in batch_ids(checkpoint / "commits") else "not in"
    text = f"batch {logged} Spark's commit log"
    query = query_id(checkpoint)
    if query is None:
        return text
    try:
        if kind == AFTER_COMMIT:
            where = after_commit_evidence(settings, query, batch)
        else:
            # read_committed would wait behind the open transaction: look at it uncommitted.
            seen = progress_markers(settings, query, "read_uncommitted")
            where = _where(seen, batch, "marker in an open transaction", "no marker in Kafka")
    except IpcountError as exc:
        return f"{text}; progress topic unreadable: {exc}"
    return f"{text}, {where}"


def confirm_faults(
    settings: Settings, checkpoint: Path, events: list[ChaosEvent]
) -> tuple[list[str], list[str]]:
    """Check, once the run is over, that each fired fault point left what it should have.

    The fault struck one sink task's transaction: the task the event names (a fault on an
    executor says which), else any task.
    sink.before_commit@N: the killed transaction was aborted, so batch N has two markers for
    read_uncommitted (the aborted one and the replay's) and one for read_committed.
    sink.after_commit@N: the commit stood and the replay (a restarted job's, or the retried
    task's) wrote nothing: one marker.

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
    tasks = sorted({p for p, _ in everything if p is not None})
    for ev in fired:
        n = ev.batch if ev.batch is not None else -1
        writers = [ev.partition] if ev.partition is not None else tasks
        counts = [(p, committed[p, n], everything[p, n]) for p in writers]
        if committed[None, n] > 1 or any(c > 1 for _, c, _ in counts):
            bad.append(f"{ev.kind}@{n}: a marker committed twice: {_counts(counts)}")
        elif ev.kind == BEFORE_COMMIT and any(c == 1 and u >= 2 for _, c, u in counts):
            good.append(
                f"{ev.kind}@{n}: transaction aborted, the task's share rewritten once by the "
                f"replay ({_counts(counts)})"
            )
        elif ev.kind == AFTER_COMMIT and any(c == 1 and u == 1 for _, c, u in counts):
            good.append(
                f"{ev.kind}@{n}: commit stood, the replay wrote nothing ({_counts(counts)})"
            )
        else:
            bad.append(
                f"{ev.kind}@{n}: progress markers {_counts(counts)}: the crash did not leave what "
                "this fault point should"
            )
    return good, bad


def _counts(counts: list[tuple[int, int, int]]) -> str:
    return "; ".join(f"task {p}: committed={c} all={u}" for p, c, u in counts) or "none"
