"""The per-batch progress line: its figures from Spark's progress JSON, as text and as JSON."""

from __future__ import annotations

import io
import json
import logging
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from ipcount import logsetup
from ipcount.observe.progress import ProgressLogger, summarize_progress

# A progress event as Spark 4.3 renders StreamingQueryProgress.json for the counts query: the
# source's offsets are JSON objects (not strings); latestOffset is the source's
# reportLatestOffset (log end and lag left after the batch, per partition). Shared with
# test_metrics.py.
PROGRESS: dict[str, Any] = json.loads((Path(__file__).parent / "progress_event.json").read_text())


def test_lag_is_what_the_source_reported_behind_the_batch() -> None:
    s = summarize_progress(PROGRESS)
    assert s["lag"] == 300
    assert s["lag_by_partition"] == {("src", 0): 300, ("src", 1): 0}
    assert s["end_offsets"] == {("src", 0): 700, ("src", 1): 650}


def test_lag_from_offsets_when_the_source_reports_no_lag_table() -> None:
    progress = json.loads(json.dumps(PROGRESS))
    progress["sources"][0]["latestOffset"] = {"offsets": {"src": {"0": 1000, "1": 660}}}
    assert summarize_progress(progress)["lag"] == 310
    progress["sources"][0]["latestOffset"] = None
    assert summarize_progress(progress)["lag"] is None


def _event(progress: dict[str, Any]) -> Any:
    return SimpleNamespace(progress=SimpleNamespace(json=json.dumps(progress)))


def test_the_progress_line_shows_the_lag() -> None:
    stream = io.StringIO()
    log = logging.getLogger("test.progress.text")
    handler = logging.StreamHandler(stream)
    log.addHandler(handler)
    log.setLevel(logging.INFO)
    try:
        ProgressLogger(log).onQueryProgress(_event(PROGRESS))
    finally:
        log.removeHandler(handler)
    line = stream.getvalue()
    assert "lag=300" in line and "records=1200" in line, line


def test_json_log_lines_carry_the_progress_fields() -> None:
    stream = io.StringIO()
    handler = logsetup.make_handler("json", stream)
    log = logging.getLogger("test.progress.json")
    log.addHandler(handler)
    log.setLevel(logging.INFO)
    log.propagate = False
    try:
        ProgressLogger(log).onQueryProgress(_event(PROGRESS))
        log.warning("plain %s", "message")
    finally:
        log.removeHandler(handler)
    first, second = (json.loads(line) for line in stream.getvalue().splitlines())
    assert first["level"] == "INFO" and first["logger"] == "test.progress.json"
    assert first["query"] == "ipcount" and first["batch"] == 7
    assert first["records"] == 1200 and first["malformed"] == 3 and first["lag"] == 300
    assert first["watermark"] == "2026-01-01T00:00:00.000Z"
    assert first["lag_by_partition"] == {"src/0": 300, "src/1": 0}
    assert "batch 7" in first["message"]
    assert second["message"] == "plain message" and second["level"] == "WARNING"
    assert "time" in second and "query" not in second


def test_rates_are_in_records_when_the_rows_are_partial_counts() -> None:
    # The counting query reads partial counts: 12 rows standing for 24,000 records.
    progress = json.loads(json.dumps(PROGRESS))
    progress.update(numInputRows=12, inputRowsPerSecond=6.0, processedRowsPerSecond=24.0)
    progress["observedMetrics"]["ipcount_quality"]["records"] = 24_000
    s = summarize_progress(progress)
    assert (s["input_rate"], s["process_rate"]) == (12_000.0, 48_000.0)
    # A query without the quality metrics (the dead-letter query) reads records: rows as they are.
    del progress["observedMetrics"]
    s = summarize_progress(progress)
    assert (s["input_rate"], s["process_rate"]) == (6.0, 24.0)
