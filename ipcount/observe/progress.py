"""Per-micro-batch progress lines from a StreamingQueryListener (driver)."""

from __future__ import annotations

import json
import logging
import time
from typing import Any

from ipcount.observe.listener import ProgressListener
from ipcount.queries import QUALITY_METRICS

__all__ = ["ProgressLogger", "summarize_progress", "end_offsets", "log_fields"]

logger = logging.getLogger(__name__)


def _num(value: Any) -> float:
    try:
        return float(value)
    except (TypeError, ValueError):
        return 0.0


def _as_object(value: Any) -> Any:
    """An offset as Spark's progress JSON holds it: an object, or (older renderings) a string."""
    if isinstance(value, str):
        try:
            return json.loads(value)
        except ValueError:
            return None
    return value


def _by_partition(table: Any) -> dict[tuple[str, int], int]:
    """{"topic": {"0": n}} -> {("topic", 0): n}; anything else -> {}."""
    out: dict[tuple[str, int], int] = {}
    if not isinstance(table, dict):
        return out
    for topic, parts in table.items():
        if not isinstance(parts, dict):
            continue
        for partition, value in parts.items():
            if isinstance(value, int) and not isinstance(value, bool) and partition.isdigit():
                out[(str(topic), int(partition))] = value
    return out


def end_offsets(source: dict[str, Any]) -> dict[tuple[str, int], int]:
    """The next offset per partition after the batch (the source's endOffset)."""
    end = _as_object(source.get("endOffset"))
    return _by_partition(end.get("offsets")) if isinstance(end, dict) else {}


def _lag(source: dict[str, Any]) -> dict[tuple[str, int], int] | None:
    """Records per partition that the source saw in the log (its stable end, read_committed) but
    left for later batches: the source's reportLatestOffset (see source.reader), else the
    difference between its latest and end offsets. None when the source reported nothing."""
    latest = _as_object(source.get("latestOffset"))
    if not isinstance(latest, dict):
        return None
    if isinstance(latest.get("lag"), dict):
        return _by_partition(latest["lag"])
    end = end_offsets(source)
    newest = _by_partition(latest.get("offsets"))
    if not newest:
        return None
    return {tp: max(0, off - end.get(tp, 0)) for tp, off in newest.items()}


def summarize_progress(progress: dict[str, Any]) -> dict[str, Any]:
    """The figures of one progress event that ipcount logs (also used by benchmarks and chaos)."""
    state = progress.get("stateOperators") or []
    sources = progress.get("sources") or []
    observed = (progress.get("observedMetrics") or {}).get(QUALITY_METRICS) or {}
    durations = progress.get("durationMs") or {}
    lag_by_partition: dict[tuple[str, int], int] = {}
    reported = False
    ends: dict[tuple[str, int], int] = {}
    for source in sources:
        lag = _lag(source)
        if lag is not None:
            reported = True
            lag_by_partition.update(lag)
        ends.update(end_offsets(source))
    rows = _num(progress.get("numInputRows"))
    # The counting query's rows are partial counts (the read tasks combine records per window and
    # IP): its rates are given in records, scaled from Spark's row rates by records per row.
    scale = _num(observed.get("records")) / rows if observed and rows > 0 else 1.0
    return {
        "name": progress.get("name"),
        "batch": progress.get("batchId"),
        "input_rows": int(rows),
        "input_rate": _rate(progress.get("inputRowsPerSecond"), scale),
        "process_rate": _rate(progress.get("processedRowsPerSecond"), scale),
        "watermark": (progress.get("eventTime") or {}).get("watermark"),
        "records": int(_num(observed.get("records"))),
        "malformed": int(_num(observed.get("malformed"))),
        "future": int(_num(observed.get("future"))),
        # Offsets deleted before they were read, skipped (failOnDataLoss=false).
        "lost": int(_num(observed.get("lost"))),
        "heartbeats": int(_num(observed.get("heartbeats"))),
        "late": int(_num(observed.get("late"))),
        # Rows Spark dropped behind the watermark (after partial aggregation: a lower bound of
        # records). With late corrections on, always 0: late records become corrections.
        "dropped": int(sum(_num(s.get("numRowsDroppedByWatermark")) for s in state)),
        "state_rows": int(sum(_num(s.get("numRowsTotal")) for s in state)),
        "state_memory_bytes": int(sum(_num(s.get("memoryUsedBytes")) for s in state)),
        "output_rows": int(_num((progress.get("sink") or {}).get("numOutputRows"))),
        "batch_ms": int(_num(durations.get("triggerExecution"))),
        "add_batch_ms": int(_num(durations.get("addBatch"))),
        "get_offset_ms": int(_num(durations.get("latestOffset"))),
        "commit_ms": int(_num(durations.get("commitOffsets"))),
        "lag": sum(lag_by_partition.values()) if reported else None,
        "lag_by_partition": lag_by_partition,
        "end_offsets": ends,
    }


def _rate(value: Any, scale: float) -> float:
    rate = _num(value)
    return rate * scale if rate >= 0 else rate


def log_fields(summary: dict[str, Any]) -> dict[str, Any]:
    """A summary as JSON-safe fields of a log record (`--log-format json`): the query's name as
    `query`, per-partition figures keyed "topic/partition"."""
    fields = {("query" if k == "name" else k): v for k, v in summary.items()}
    for key in ("lag_by_partition", "end_offsets"):
        fields[key] = {f"{t}/{p}": n for (t, p), n in sorted(summary.get(key, {}).items())}
    return fields


class ProgressLogger(ProgressListener):
    """Logs one line per micro-batch with input, rates, watermark, bad records, state and lag."""

    def __init__(self, log: logging.Logger | None = None) -> None:
        self._log = log or logger
        self.last: dict[str, Any] | None = None
        self.started = time.monotonic()

    def onQueryStarted(self, event: Any) -> None:  # noqa: N802 - Spark hook
        self._log.info("query %s started (run %s)", event.name, event.runId)

    def onQueryProgress(self, event: Any) -> None:  # noqa: N802 - Spark hook
        progress = json.loads(event.progress.json)
        s = summarize_progress(progress)
        self.last = s
        self._log.info(
            "%s batch %s: records=%d (%.0f/s in, %.0f/s processed) in=%d rows malformed=%d "
            "future=%d heartbeats=%d late=%d dropped=%d out=%d watermark=%s state=%d rows "
            "batch=%dms sink+agg=%dms lag=%s",
            s["name"],
            s["batch"],
            s["records"],
            s["input_rate"],
            s["process_rate"],
            s["input_rows"],
            s["malformed"],
            s["future"],
            s["heartbeats"],
            s["late"],
            s["dropped"],
            s["output_rows"],
            s["watermark"],
            s["state_rows"],
            s["batch_ms"],
            s["add_batch_ms"],
            s["lag"] if s["lag"] is not None else "?",
            extra={"fields": log_fields(s)},
        )
        if s["lost"]:
            self._log.warning(
                "%s batch %s: skipped %d offsets deleted before they were read "
                "(job.fail_on_data_loss = false; metric ipcount_source_lost_records_total)",
                s["name"],
                s["batch"],
                s["lost"],
            )

    def onQueryIdle(self, event: Any) -> None:  # noqa: N802 - Spark hook
        pass

    def onQueryTerminated(self, event: Any) -> None:  # noqa: N802 - Spark hook
        if event.exception:
            self._log.error(
                "query %s terminated with error: %s", event.id, event.exception.splitlines()[0]
            )
        else:
            self._log.info("query %s stopped", event.id)
