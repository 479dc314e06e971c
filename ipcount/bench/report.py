"""Where a benchmarked run's time went, from Spark's progress events and its event log (bench
process, after the run): per-phase sums, executor stages, state store, memory.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

from ipcount.queries import QUALITY_METRICS

__all__ = [
    "PhaseTotals",
    "StageTotals",
    "Sustained",
    "batch_records",
    "batch_end",
    "sustained",
    "warm",
    "data_batch_spans",
    "phase_totals",
    "stage_totals",
    "event_log_conf",
]

_PHASES = ("latestOffset", "queryPlanning", "walCommit", "addBatch", "commitOffsets")


def event_log_conf(directory: Path) -> dict[str, str]:
    """Spark settings that write an uncompressed event log into `directory` (created here)."""
    directory.mkdir(parents=True, exist_ok=True)
    return {
        "spark.eventLog.enabled": "true",
        "spark.eventLog.compress": "false",
        "spark.eventLog.dir": directory.resolve().as_uri(),
    }


@dataclass
class PhaseTotals:
    """Sums over the micro-batches of one query (seconds unless named otherwise)."""

    # Progress events summed; data_batches: those that read access records.
    batches: int = 0
    data_batches: int = 0
    # numInputRows (the counting query's rows are partial counts) and the access records behind
    # them (batch_records).
    input_rows: int = 0
    records: int = 0
    # durationMs.triggerExecution, over every batch and over the data batches alone.
    trigger: float = 0.0
    data_trigger: float = 0.0
    # The other durationMs phases (_PHASES: latestOffset, queryPlanning, walCommit, ...), by name.
    phases: dict[str, float] = field(default_factory=dict)
    # The stateOperators' times: allUpdatesTimeMs, allRemovalsTimeMs, commitTimeMs.
    state_updates: float = 0.0
    state_removals: float = 0.0
    state_commit: float = 0.0
    # Peaks over the batches of numRowsTotal and memoryUsedBytes (summed over the operators);
    # numRowsDroppedByWatermark summed (rows the state store judged late).
    state_rows_peak: int = 0
    state_memory_peak: int = 0
    dropped_rows: int = 0

    @property
    def batch_rate(self) -> float:
        """Access records per second of the time of batches with records (excludes the time
        between batches and the flush batches). Records, not input rows: the counting query's
        rows are partial counts."""
        return self.records / self.data_trigger if self.data_trigger > 0 else 0.0


def _ms(d: dict[str, Any], key: str) -> float:
    try:
        return float(d.get(key) or 0) / 1000
    except (TypeError, ValueError):
        return 0.0


def _quality(progress: dict[str, Any]) -> dict[str, Any] | None:
    observed = (progress.get("observedMetrics") or {}).get(QUALITY_METRICS)
    return observed if isinstance(observed, dict) and "records" in observed else None


def batch_records(progress: dict[str, Any], rows: int | None = None) -> int:
    """Access records in a batch (input rows minus heartbeats), from ipcount's observed metrics.

    Without them (a query that does not observe them) the input rows count, except that a batch
    of one row is taken for a heartbeat (AvailableNow's flush batches are one heartbeat each)."""
    observed = _quality(progress)
    if observed is not None:
        return int(observed.get("records") or 0)
    n = int(progress.get("numInputRows") or 0) if rows is None else rows
    return n if n > 1 else 0


def batch_end(event: dict[str, Any]) -> float | None:
    """When a recorded progress event's batch ended (epoch s): Spark's own clock, the batch's
    `timestamp` (trigger start) + triggerExecution (which ends after the sink's commit and the
    commit log); the listener's `at` when those are missing (it lags by the event's delivery to
    the Python listener, which varies with the driver's load)."""
    progress = event.get("progress") or {}
    trigger = (progress.get("durationMs") or {}).get("triggerExecution")
    start = _batch_start(event)
    if start is not None and trigger is not None:
        try:
            return start + float(trigger) / 1000
        except (TypeError, ValueError):
            pass
    at = event.get("at")
    return None if at is None else float(at)


@dataclass(frozen=True)
class Sustained:
    """Steady-state throughput: the data batches after the first, from the end of the first data
    batch to the end of the last (the first one's Python worker start and JIT warm-up, and the
    flush batches after the last records, are left out)."""

    records: int
    seconds: float
    batches: int

    @property
    def rate(self) -> float:
        return self.records / self.seconds


def sustained(events: Iterable[dict[str, Any]]) -> Sustained | None:
    """Sustained events/s from the job child's events (ipcount.bench.timed_job: `progress` events
    with `at` and Spark's progress JSON), or None with fewer than two data batches."""
    data = _data_batches(events)
    if len(data) < 2:
        return None
    seconds = data[-1].end - data[0].end
    if seconds <= 0:
        return None
    return Sustained(sum(d.records for d in data[1:]), seconds, len(data) - 1)


def warm(events: Iterable[dict[str, Any]]) -> Sustained | None:
    """Warm events/s: the later half of the data batches alone, from the end of the batch before
    them to the end of the last (None with fewer than four data batches). A run's batches get
    faster for a while (the JVM compiles, Python workers start): `sustained` counts that warm-up
    in, this leaves it out, as a job that runs all day does."""
    data = _data_batches(events)
    if len(data) < 4:
        return None
    first = len(data) - len(data) // 2  # the first warm batch: the last half, rounded down
    seconds = data[-1].end - data[first - 1].end
    if seconds <= 0:
        return None
    return Sustained(sum(d.records for d in data[first:]), seconds, len(data) - first)


def data_batch_spans(events: Iterable[dict[str, Any]], steady: bool) -> list[tuple[float, float]]:
    """When each data batch ran (epoch s, trigger start to end), in batchId order; `steady`
    leaves out the first. A batch without Spark's timestamp has no start and is left out."""
    data = _data_batches(events)[1 if steady else 0 :]
    return [(d.start, d.end) for d in data if d.start is not None]


@dataclass(frozen=True)
class _DataBatch:
    batch_id: int
    start: float | None
    end: float
    records: int


def _data_batches(events: Iterable[dict[str, Any]]) -> list[_DataBatch]:
    """The counting query's batches with access records, in batchId order.

    A data batch has access records (batch_records > 0: heartbeat-only batches are not). When
    some batches carry ipcount's observed metrics, batches without them belong to another
    query (the dead-letter query) and are left out."""
    progress = [ev for ev in events if ev.get("event") == "progress" and ev.get("progress")]
    if any(_quality(ev["progress"]) is not None for ev in progress):
        progress = [ev for ev in progress if _quality(ev["progress"]) is not None]
    data = [
        _DataBatch(int(ev["progress"].get("batchId") or 0), _batch_start(ev), end, records)
        for ev in progress
        if (records := batch_records(ev["progress"])) > 0 and (end := batch_end(ev)) is not None
    ]
    return sorted(data, key=lambda d: d.batch_id)


def _batch_start(event: dict[str, Any]) -> float | None:
    stamp = (event.get("progress") or {}).get("timestamp")
    try:
        return datetime.fromisoformat(str(stamp)).timestamp() if stamp else None
    except (TypeError, ValueError):
        return None


def phase_totals(progress: Iterable[dict[str, Any]]) -> PhaseTotals:
    """Sum durationMs phases and stateOperators figures over progress events."""
    t = PhaseTotals(phases={p: 0.0 for p in _PHASES})
    for p in progress:
        t.batches += 1
        rows = int(p.get("numInputRows") or 0)
        durations = p.get("durationMs") or {}
        trigger = _ms(durations, "triggerExecution")
        t.trigger += trigger
        t.input_rows += rows
        records = batch_records(p, rows)
        t.records += records
        if records:
            t.data_batches += 1
            t.data_trigger += trigger
        for phase in _PHASES:
            t.phases[phase] += _ms(durations, phase)
        for op in p.get("stateOperators") or []:
            t.state_updates += _ms(op, "allUpdatesTimeMs")
            t.state_removals += _ms(op, "allRemovalsTimeMs")
            t.state_commit += _ms(op, "commitTimeMs")
            t.dropped_rows += int(op.get("numRowsDroppedByWatermark") or 0)
        t.state_rows_peak = max(
            t.state_rows_peak, sum(int(op.get("numRowsTotal") or 0) for op in p["stateOperators"])
        )
        t.state_memory_peak = max(
            t.state_memory_peak,
            sum(int(op.get("memoryUsedBytes") or 0) for op in p["stateOperators"]),
        )
    return t


@dataclass
class StageTotals:
    """Executor-side figures from the event log, by stage kind: `map` stages read the source,
    parse and pre-aggregate (they write shuffle output); `reduce` stages run the state store and
    the sink's executor side (encode). Seconds; bytes for Python traffic."""

    jobs_wall: float = 0.0
    # Driver time inside the batches' SQL executions before their first Spark job (planning the
    # source's partitions, creating the sink writer) and after their last one (the sink's
    # driver-side commit: the query's marker, in one Kafka transaction).
    driver_before: float = 0.0
    driver_after: float = 0.0
    # By stage kind ('map', 'reduce'): the stages' wall time, and their tasks' run and CPU time.
    wall: dict[str, float] = field(default_factory=dict)
    task_run: dict[str, float] = field(default_factory=dict)
    task_cpu: dict[str, float] = field(default_factory=dict)
    # Over every task: JVM GC time, bytes to and from the Python workers, shuffle write time.
    gc: float = 0.0
    python_sent: int = 0
    python_returned: int = 0
    shuffle_write: float = 0.0
    # Tasks seen; found: the event log held at least one (False: no figures, not zeros).
    tasks: int = 0
    found: bool = False


def _events(directory: Path) -> Iterable[dict[str, Any]]:
    for path in sorted(directory.rglob("events_*")) + sorted(directory.glob("local-*")):
        if path.suffix in (".zstd", ".lz4", ".snappy", ".crc"):
            continue
        with open(path, encoding="utf-8") as fh:
            for line in fh:
                if line.strip():
                    yield json.loads(line)


def stage_totals(directory: Path) -> StageTotals:
    """Parse the (uncompressed) event log(s) under `directory`."""
    out = StageTotals(wall={}, task_run={}, task_cpu={})
    kinds: dict[int, str] = {}
    stage_wall: dict[int, float] = {}
    job_start: dict[int, int] = {}
    tasks: list[tuple[int, dict[str, Any], dict[str, Any]]] = []
    job_exec: dict[int, int] = {}
    exec_span: dict[int, list[int]] = {}
    exec_jobs: dict[int, list[int]] = {}
    for ev in _events(directory):
        kind = str(ev.get("Event"))
        if kind == "SparkListenerJobStart":
            job_start[ev["Job ID"]] = ev["Submission Time"]
            exec_id = (ev.get("Properties") or {}).get("spark.sql.execution.id")
            if exec_id is not None:
                job_exec[ev["Job ID"]] = int(exec_id)
                exec_jobs.setdefault(int(exec_id), []).append(ev["Submission Time"])
        elif kind == "SparkListenerJobEnd" and ev["Job ID"] in job_start:
            out.jobs_wall += (ev["Completion Time"] - job_start[ev["Job ID"]]) / 1000
            if ev["Job ID"] in job_exec:
                exec_jobs[job_exec[ev["Job ID"]]].append(ev["Completion Time"])
        elif kind.endswith("SparkListenerSQLExecutionStart"):
            exec_span[ev["executionId"]] = [ev["time"], ev["time"]]
        elif kind.endswith("SparkListenerSQLExecutionEnd") and ev["executionId"] in exec_span:
            exec_span[ev["executionId"]][1] = ev["time"]
        elif kind == "SparkListenerStageCompleted":
            info = ev["Stage Info"]
            if info.get("Submission Time") and info.get("Completion Time"):
                stage_wall[info["Stage ID"]] = (
                    info["Completion Time"] - info["Submission Time"]
                ) / 1000
        elif kind == "SparkListenerTaskEnd":
            names = {
                a.get("Name"): a.get("Update") for a in ev["Task Info"].get("Accumulables", [])
            }
            tasks.append((ev["Stage ID"], ev.get("Task Metrics") or {}, names))
            if "time to commit changes" in names:
                kinds[ev["Stage ID"]] = "reduce"
            elif "shuffle write time" in names:
                kinds.setdefault(ev["Stage ID"], "map")
    for stage, metrics, names in tasks:
        kind = kinds.get(stage, "other")
        out.found = True
        out.tasks += 1
        out.task_run[kind] = (
            out.task_run.get(kind, 0.0) + metrics.get("Executor Run Time", 0) / 1000
        )
        out.task_cpu[kind] = out.task_cpu.get(kind, 0.0) + metrics.get("Executor CPU Time", 0) / 1e9
        out.gc += metrics.get("JVM GC Time", 0) / 1000
        out.python_sent += _int(names.get("data sent to Python workers"))
        out.python_returned += _int(names.get("data returned from Python workers"))
        out.shuffle_write += _int(names.get("shuffle write time")) / 1e9
    for exec_id, times in exec_jobs.items():
        if exec_id in exec_span:
            begin, end = exec_span[exec_id]
            out.driver_before += max(0, min(times) - begin) / 1000
            out.driver_after += max(0, end - max(times)) / 1000
    for stage, wall in stage_wall.items():
        kind = kinds.get(stage, "other")
        out.wall[kind] = out.wall.get(kind, 0.0) + wall
    return out


def _int(value: Any) -> int:
    try:
        return int(value or 0)
    except (TypeError, ValueError):
        return 0
