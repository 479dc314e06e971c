"""The driver's /metrics and /healthz, scraped over HTTP as Prometheus would, fed with Spark's
progress events (no Spark here: the events are progress JSON as Spark renders it)."""

from __future__ import annotations

import copy
import json
import math
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from ipcount.observe.endpoint import MetricsServer
from ipcount.observe.metrics import JobMetrics, MetricsListener

PROGRESS = json.loads((Path(__file__).parent / "progress_event.json").read_text())
REQUIRED = {
    "ipcount_records_total",
    "ipcount_input_records_per_second",
    "ipcount_source_lag_records",
    "ipcount_watermark_timestamp_seconds",
    "ipcount_watermark_delay_seconds",
    "ipcount_batch_duration_seconds_bucket",
    "ipcount_results_total",
    "ipcount_transactions_committed_total",
    "ipcount_transactions_aborted_total",
    "ipcount_late_records_total",
    "ipcount_malformed_records_total",
    "ipcount_future_records_total",
    "ipcount_heartbeats_total",
    "ipcount_query_restarts_total",
    "ipcount_query_up",
    "ipcount_last_progress_timestamp_seconds",
}


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def metrics(clock: Clock) -> JobMetrics:
    return JobMetrics(stall_seconds=60, clock=clock, wall=lambda: 1767225660.0)


@pytest.fixture
def url(metrics: JobMetrics) -> Iterator[str]:
    server = MetricsServer(metrics, "127.0.0.1", 0).start()
    try:
        yield f"http://127.0.0.1:{server.port}"
    finally:
        server.stop()


def _get(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=5) as resp:  # noqa: S310 - local test server
            return resp.status, resp.read().decode()
    except urllib.error.HTTPError as err:
        return err.code, err.read().decode()


def _samples(url: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    status, text = _get(url + "/metrics")
    assert status == 200
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def test_every_documented_metric_is_served(metrics: JobMetrics, url: str) -> None:
    metrics.started()
    metrics.progress(PROGRESS)
    names = {name for name, _ in _samples(url)}
    assert REQUIRED <= names, REQUIRED - names


def test_progress_events_become_counters_and_gauges(metrics: JobMetrics, url: str) -> None:
    metrics.started()
    metrics.progress(PROGRESS)
    second = copy.deepcopy(PROGRESS)
    second["batchId"] = 8
    second["sink"]["numOutputRows"] = 0  # an idle batch: no transaction
    second["eventTime"]["watermark"] = "2026-01-01T00:00:05.000Z"
    metrics.progress(second)
    got = _samples(url)
    assert got[("ipcount_records_total", ())] == 2400
    assert got[("ipcount_malformed_records_total", ())] == 6
    assert got[("ipcount_late_records_total", ())] == 4
    assert got[("ipcount_future_records_total", ())] == 2
    assert got[("ipcount_heartbeats_total", ())] == 2
    assert got[("ipcount_results_total", ())] == 12
    assert got[("ipcount_transactions_committed_total", (("query", "ipcount"),))] == 1
    assert got[("ipcount_batch_duration_seconds_count", (("query", "ipcount"),))] == 2
    # 1201 rows (1200 records and a heartbeat) at 600.5 rows/s: 600 records/s.
    assert got[("ipcount_input_records_per_second", ())] == 600.0
    assert got[("ipcount_source_lag_records", (("partition", "0"), ("topic", "src")))] == 300
    assert got[("ipcount_watermark_timestamp_seconds", ())] == 1767225605.0
    assert got[("ipcount_watermark_delay_seconds", ())] == 55.0
    assert got[("ipcount_query_up", ())] == 1
    assert got[("ipcount_last_progress_timestamp_seconds", ())] == 1767225660.0


def test_before_any_watermark_the_watermark_is_nan(metrics: JobMetrics, url: str) -> None:
    got = _samples(url)
    assert math.isnan(got[("ipcount_watermark_timestamp_seconds", ())])
    assert math.isnan(got[("ipcount_watermark_delay_seconds", ())])
    assert got[("ipcount_query_up", ())] == 0


def test_a_failure_and_restart(metrics: JobMetrics, url: str, clock: Clock) -> None:
    metrics.started()
    metrics.query_started("q1", "ipcount")
    metrics.query_terminated("q1", "TransactionAbortedError: aborted\n\tat ...")
    metrics.failed("TransactionAbortedError: aborted", restart_delay=10)
    status, body = _get(url + "/healthz")
    assert status == 503 and body.startswith("query failed: TransactionAbortedError"), body
    assert body.count("\n") == 1
    got = _samples(url)
    assert got[("ipcount_transactions_aborted_total", (("query", "ipcount"),))] == 1
    assert got[("ipcount_query_restarts_total", ())] == 0  # not yet restarted
    assert got[("ipcount_query_up", ())] == 0
    clock.now += 11
    metrics.started(restarted=True)
    assert _get(url + "/healthz")[0] == 200
    assert _samples(url)[("ipcount_query_restarts_total", ())] == 1
    metrics.stopping()
    assert _get(url + "/healthz") == (503, "stopped: the job was asked to stop\n")


def test_stalled_only_while_records_wait(metrics: JobMetrics, url: str, clock: Clock) -> None:
    metrics.started()
    metrics.set_lag({("src", 0): 0})
    clock.now += 3600  # idle for an hour: healthy
    assert _get(url + "/healthz")[0] == 200
    metrics.set_lag({("src", 0): 40})  # records arrive: the stall clock starts now
    clock.now += 59
    assert _get(url + "/healthz")[0] == 200
    clock.now += 2
    status, body = _get(url + "/healthz")
    assert status == 503 and "while 40 records wait" in body, body
    metrics.progress(PROGRESS)  # a batch finished
    assert _get(url + "/healthz")[0] == 200


def test_unknown_paths_are_404(url: str) -> None:
    assert _get(url + "/nope")[0] == 404


def test_unknown_figures_in_a_progress_event_do_not_freeze_the_metrics(
    metrics: JobMetrics, url: str, clock: Clock
) -> None:
    """Spark writes -1 for a figure it does not know: the batch still counts as progress."""
    metrics.started()
    metrics.set_lag({("src", 0): 40})
    clock.now += 61  # records wait and no batch finished: stalled
    assert _get(url + "/healthz")[0] == 503
    odd = copy.deepcopy(PROGRESS)
    odd["sink"]["numOutputRows"] = -1
    odd["durationMs"]["triggerExecution"] = -1
    odd["inputRowsPerSecond"] = -1
    for key in ("records", "late"):
        odd["observedMetrics"]["ipcount_quality"][key] = -1

    class Event:
        class progress:  # noqa: N801 - Spark's QueryProgressEvent.progress
            json = json.dumps(odd)

    MetricsListener(metrics).onQueryProgress(Event())
    status, body = _get(url + "/healthz")
    assert status == 200, body
    got = _samples(url)
    assert got[("ipcount_last_progress_timestamp_seconds", ())] == 1767225660.0
    assert got[("ipcount_results_total", ())] == 0
    assert got[("ipcount_records_total", ())] == 0
    assert got[("ipcount_late_records_total", ())] == 0
    assert got[("ipcount_malformed_records_total", ())] == 3  # the known figures still count
    assert got[("ipcount_batches_total", (("query", "ipcount"),))] == 1
    assert got[("ipcount_transactions_committed_total", (("query", "ipcount"),))] == 0
    assert got[("ipcount_input_records_per_second", ())] == 0


def test_offsets_lost_to_retention_are_counted(metrics: JobMetrics, url: str) -> None:
    """failOnDataLoss=false: the read tasks' tally of skipped offsets reaches Prometheus."""
    metrics.started()
    lossy = copy.deepcopy(PROGRESS)
    lossy["observedMetrics"]["ipcount_quality"]["lost"] = 3000
    metrics.progress(lossy)
    metrics.progress(PROGRESS)
    got = _samples(url)
    assert got[("ipcount_source_lost_records_total", ())] == 3000
    assert got[("ipcount_records_total", ())] == 2400  # lost offsets are not records read
