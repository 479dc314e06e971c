"""The job's streaming listeners against a real Spark query: each progress event reaches them as
its JSON, without PySpark turning it into Python objects field by field first (each Java map it
iterates ends in an exception PySpark converts with ten class lookups, on the listener bus's
thread: ~20% of a core at 20,000 records/s, measured with JFR)."""

from __future__ import annotations

import json
import time
from typing import Any

import py4j.java_gateway
import pytest
from pyspark.sql import functions as F

from ipcount.observe.progress import ProgressLogger


class _Seen(ProgressLogger):
    def __init__(self) -> None:
        super().__init__()
        self.progress: list[dict[str, Any]] = []

    def onQueryProgress(self, event: Any) -> None:  # noqa: N802 - Spark hook
        super().onQueryProgress(event)
        self.progress.append(json.loads(event.progress.json))


def test_progress_reaches_the_listeners_as_json_without_exception_conversions(
    spark: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    checks: list[str] = []
    real = py4j.java_gateway.is_instance_of

    def counted(gateway: Any, obj: Any, cls: Any) -> Any:
        checks.append(str(cls))
        return real(gateway, obj, cls)

    monkeypatch.setattr(py4j.java_gateway, "is_instance_of", counted)
    seen = _Seen()
    spark.streams.addListener(seen)
    rows = spark.readStream.format("rate").option("rowsPerSecond", 50).load()
    observed = rows.observe("seen", F.count(F.lit(1)).alias("rows"))
    query = observed.writeStream.format("noop").trigger(processingTime="300 milliseconds").start()
    try:
        deadline = time.monotonic() + 60
        while len(seen.progress) < 4 and time.monotonic() < deadline:
            time.sleep(0.1)
    finally:
        query.stop()
        spark.streams.removeListener(seen)
    assert len(seen.progress) >= 4
    # The whole progress, observed metrics and all.
    assert all(p["durationMs"]["triggerExecution"] >= 0 for p in seen.progress)
    assert any(p["observedMetrics"]["seen"]["rows"] > 0 for p in seen.progress)
    assert seen.last is not None and seen.last["name"] is None
    assert checks == []
