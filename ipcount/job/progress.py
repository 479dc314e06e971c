"""Per-micro-batch progress lines from a StreamingQueryListener (driver)."""

from __future__ import annotations

import json
import logging
import time
from typing import Any

from pyspark.sql.streaming import StreamingQueryListener

__all__ = ["ProgressLogger", "summarize_progress"]

logger = logging.getLogger(__name__)


def _num(value: Any) -> float:
    try:
        return float(value)
    except (TypeError, ValueError):
        return 0.0


def _lag(source: dict[str, Any]) -> int | None:
    """Records between the batch's end offsets and the latest offsets the source reported."""
    try:
        end = json.loads(source.get("endOffset") or "null")
        latest = json.loads(source.get("latestOffset") or "null")
    except (TypeError, ValueError):
        return None
    if not isinstance(end, dict) or not isinstance(latest, dict):
        return None
    end_parts, latest_parts = _flatten(end), _flatten(latest)
    return int(sum(max(0, latest_parts[k] - end_parts.get(k, 0)) for k in latest_parts))


def _flatten(offsets: dict[str, Any], prefix: str = "") -> dict[str, int]:
    out: dict[str, int] = {}
    for key, value in offsets.items():
        if isinstance(value, dict):
            out.update(_flatten(value, f"{prefix}{key}/"))
        elif isinstance(value, int) and not isinstance(value, bool):
            out[f"{prefix}{key}"] = value
    return out


def summarize_progress(progress: dict[str, Any]) -> dict[str, Any]:
    """The figures of one progress event that ipcount logs (also used by benchmarks and chaos)."""
    state = progress.get("stateOperators") or []
    sources = progress.get("sources") or []
    observed = (progress.get("observedMetrics") or {}).get("ipcount_quality") or {}
    durations = progress.get("durationMs") or {}
    lags = [lag for lag in (_lag(s) for s in sources) if lag is not None]
    return {
        "name": progress.get("name"),
        "batch": progress.get("batchId"),
        "input_rows": int(_num(progress.get("numInputRows"))),
        "input_rate": _num(progress.get("inputRowsPerSecond")),
        "process_rate": _num(progress.get("processedRowsPerSecond")),
        "watermark": (progress.get("eventTime") or {}).get("watermark"),
        "records": int(_num(observed.get("records"))),
        "malformed": int(_num(observed.get("malformed"))),
        "future": int(_num(observed.get("future"))),
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
        "lag": sum(lags) if lags else None,
    }


class ProgressLogger(StreamingQueryListener):
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
            "%s batch %s: in=%d rows (%.0f/s in, %.0f/s processed) records=%d malformed=%d "
            "future=%d heartbeats=%d late=%d dropped=%d out=%d watermark=%s state=%d rows "
            "batch=%dms sink+agg=%dms lag=%s",
            s["name"],
            s["batch"],
            s["input_rows"],
            s["input_rate"],
            s["process_rate"],
            s["records"],
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
