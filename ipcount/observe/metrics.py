"""The job's Prometheus metrics and health state (driver), fed by Spark's progress events, the
restart strategy and the lag poller."""

from __future__ import annotations

import json
import logging
import math
import threading
import time
from collections.abc import Callable, Mapping
from datetime import datetime
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from ipcount.observe.health import Health, HealthFacts, judge_health
from ipcount.observe.listener import ProgressListener
from ipcount.observe.progress import summarize_progress
from ipcount.observe.state_store import StateStoreFigures
from ipcount.queries import COUNTS_QUERY

__all__ = ["JobMetrics", "MetricsListener", "BATCH_BUCKETS"]

logger = logging.getLogger(__name__)

BATCH_BUCKETS = (0.25, 0.5, 1.0, 2.0, 3.0, 5.0, 10.0, 20.0, 30.0, 60.0, 120.0, 300.0)

TopicPartition = tuple[str, int]


def _iso_seconds(text: Any) -> float | None:
    """Spark's watermark ("2026-01-01T00:00:00.000Z") in unix seconds; None before any event."""
    if not isinstance(text, str):
        return None
    try:
        seconds = datetime.fromisoformat(text).timestamp()
    except ValueError:
        return None
    return seconds if seconds > 0 else None


# Every series' help text, by name.
_HELP = {
    "ipcount_records": "Source records read by the counting query (malformed and future "
    "included, heartbeats excluded)",
    "ipcount_input_records_per_second": "Source records per second of the counting query's last "
    "micro-batch (Spark's inputRowsPerSecond scaled by records per row: the rows are partial "
    "counts)",
    "ipcount_source_lag_records": "Records in the source partition's stable log (read_committed "
    "end) not yet read by a finished micro-batch of the counting query",
    "ipcount_watermark_timestamp_seconds": "The counting query's event-time watermark (unix "
    "seconds; NaN before the first)",
    "ipcount_watermark_delay_seconds": "Wall-clock time now minus the watermark (NaN before the "
    "first watermark)",
    "ipcount_batch_duration_seconds": "Micro-batch duration (Spark's triggerExecution)",
    "ipcount_batches": "Finished micro-batches",
    "ipcount_results": "Rows the counting query committed: (window, IP) results, plus late-count "
    "corrections when there are late records",
    # The sink's commit() runs in a Python worker, not here, so transactions are counted from
    # what the driver sees: a finished micro-batch that wrote rows committed one transaction; a
    # failed micro-batch's transaction never commits (the sink aborts it, or the restarted
    # query's init_transactions does).
    "ipcount_transactions_committed": "Micro-batches the sink committed (each in one Kafka "
    "transaction per sink task, then the query's marker): finished micro-batches that wrote rows",
    "ipcount_transactions_aborted": "Queries that ended with an error: the failed micro-batch's "
    "transaction, if begun, never commits",
    "ipcount_late_records": "Records that arrived after their window's result was emitted",
    "ipcount_malformed_records": "Records that are not an access-log line (dead-lettered when "
    "enabled)",
    "ipcount_future_records": "Records stamped too far ahead of the batch's time (not counted)",
    "ipcount_heartbeats": "Idle heartbeats the source emitted to move the watermark",
    "ipcount_source_lost_records": "Source offsets deleted before they were read, skipped "
    "(job.fail_on_data_loss = false)",
    "ipcount_query_restarts": "In-process query restarts (job.restart_attempts)",
    "ipcount_query_restarts_left": "Restarts left in the window (job.restart_attempts within "
    "job.restart_window_seconds)",
    "ipcount_query_up": "1 while every query of the job runs",
    "ipcount_last_progress_timestamp_seconds": "Unix time of the counting query's last finished "
    "micro-batch (0: none yet)",
    # The state store's gauges, set by the state store poller.
    "ipcount_state_store_bytes": "Bytes of the counting query's state store in the checkpoint",
    "ipcount_state_store_files": "Files of the counting query's state store in the checkpoint",
    "ipcount_state_store_changelog_files": "Changelog (or delta) files of the state store",
    "ipcount_state_store_snapshot_files": "Snapshot files of the state store",
    "ipcount_state_store_snapshot_version": "The last snapshot's version in the store partition "
    "furthest from one (0: none yet)",
    "ipcount_state_store_snapshot_lag_versions": "Versions written since that snapshot",
    "ipcount_state_store_snapshot_age_seconds": "Seconds since the first version after that "
    "snapshot was written (0: nothing since it)",
    "ipcount_state_store_degraded": "1 while state snapshots are not being written (see /healthz)",
}
# The record-quality counters (progress figure -> series), fed by each counting batch.
_QUALITY = {
    "late": "ipcount_late_records",
    "malformed": "ipcount_malformed_records",
    "future": "ipcount_future_records",
    "heartbeats": "ipcount_heartbeats",
    "lost": "ipcount_source_lost_records",
}
# The state store's gauges (ipcount_state_store_<key>).
_STATE_GAUGES = (
    "bytes",
    "files",
    "changelog_files",
    "snapshot_files",
    "snapshot_version",
    "snapshot_lag_versions",
    "snapshot_age_seconds",
    "degraded",
)


class JobMetrics:
    """Every metric of one driver process, in its own registry, plus what /healthz judges by.

    Thread-safe: Spark's listener thread, the runner, the lag poller and HTTP scrapes use it.
    """

    def __init__(
        self,
        queries: tuple[str, ...] = (COUNTS_QUERY,),
        *,
        stall_seconds: float = 120.0,
        clock: Callable[[], float] = time.monotonic,
        wall: Callable[[], float] = time.time,
    ) -> None:
        self.registry = CollectorRegistry()
        self.stall_seconds = stall_seconds
        self._clock, self._wall = clock, wall
        self._lock = threading.Lock()
        self._names: dict[str, str] = {}  # query id -> name
        self._watermark: float | None = None
        self._running = False
        self._stopping = False
        self._failure: str | None = None
        self._restart_at: float | None = None
        self._since = clock()
        self._waiting_since: float | None = None
        self._lag: int | None = 0
        self._lag_error = ""
        self._degraded = ""
        self.positions: dict[TopicPartition, int] = {}
        self._declare_metrics()
        for name in queries:
            for metric in (self.batches, self.committed, self.aborted):
                metric.labels(query=name)

    def _declare_metrics(self) -> None:
        """Every series, its help text from _HELP."""
        r = self.registry

        def counter(name: str, *labels: str) -> Counter:
            return Counter(name, _HELP[name], labels, registry=r)

        def gauge(name: str, *labels: str) -> Gauge:
            return Gauge(name, _HELP[name], labels, registry=r)

        self.records = counter("ipcount_records")
        self.input_rate = gauge("ipcount_input_records_per_second")
        self.lag = gauge("ipcount_source_lag_records", "topic", "partition")
        self.watermark = gauge("ipcount_watermark_timestamp_seconds")
        self.watermark.set(math.nan)
        self.watermark_delay = gauge("ipcount_watermark_delay_seconds")
        self.watermark_delay.set_function(self._watermark_delay)
        self.batch_duration = Histogram(
            "ipcount_batch_duration_seconds",
            _HELP["ipcount_batch_duration_seconds"],
            ["query"],
            buckets=BATCH_BUCKETS,
            registry=r,
        )
        self.batches = counter("ipcount_batches", "query")
        self.results = counter("ipcount_results")
        self.committed = counter("ipcount_transactions_committed", "query")
        self.aborted = counter("ipcount_transactions_aborted", "query")
        self.quality = {key: counter(name) for key, name in _QUALITY.items()}
        self.restarts = counter("ipcount_query_restarts")
        self.restarts_left = gauge("ipcount_query_restarts_left")
        self.up = gauge("ipcount_query_up")
        self.state = {key: gauge(f"ipcount_state_store_{key}") for key in _STATE_GAUGES}
        self.last_progress = gauge("ipcount_last_progress_timestamp_seconds")

    # --- the runner ---------------------------------------------------------------------------

    def started(self, *, restarted: bool = False) -> None:
        """The queries started; `restarted`: by the restart strategy after a failure."""
        if restarted:
            self.restarts.inc()
        with self._lock:
            self._running, self._failure, self._restart_at = True, None, None
            self._since = max(self._since, self._clock())
        self.up.set(1)

    def restart_budget(self, left: Callable[[], int]) -> None:
        """Where the restart strategy says how many restarts are left in its window now."""
        self.restarts_left.set_function(left)

    def failed(self, reason: str, restart_delay: float | None) -> None:
        """A query failed; `restart_delay`: seconds until the restart is due (None: no restart).
        The restart counts when it happens (`started(restarted=True)`), not here: a stop during
        the delay cancels it."""
        self.up.set(0)
        with self._lock:
            self._running, self._failure = False, reason.splitlines()[0] if reason else reason
            self._restart_at = None if restart_delay is None else self._clock() + restart_delay

    def stopping(self) -> None:
        """The job was asked to stop, or its queries ended."""
        with self._lock:
            self._stopping = True
        self.up.set(0)

    # --- Spark's listener ---------------------------------------------------------------------

    def query_started(self, query_id: str, name: str) -> None:
        with self._lock:
            self._names[query_id] = name

    def query_terminated(self, query_id: str, error: str | None) -> None:
        """A query ended; with an error, its failed micro-batch's transaction never commits."""
        name = self._names.get(query_id, COUNTS_QUERY)
        if error:
            self.aborted.labels(query=name).inc()

    def progress(self, progress: Mapping[str, Any]) -> None:
        """One finished micro-batch (Spark's progress JSON as a dict). Spark writes -1 for a
        figure it does not know; such a figure counts as 0."""
        s = summarize_progress(dict(progress))
        name = s["name"] or COUNTS_QUERY
        watermark = _iso_seconds(s["watermark"])
        if name == COUNTS_QUERY:
            # First what /healthz judges by: a batch finished, whatever its figures say.
            self.last_progress.set(self._wall())
            with self._lock:
                self._watermark = watermark if watermark is not None else self._watermark
                self._since = max(self._since, self._clock())
                self.positions.update(s["end_offsets"])
        self.batches.labels(query=name).inc()
        self.batch_duration.labels(query=name).observe(max(0, s["batch_ms"]) / 1000)
        if s["output_rows"] > 0:
            self.committed.labels(query=name).inc()
        if name != COUNTS_QUERY:
            return
        self.records.inc(max(0, s["records"]))
        for key, counter in self.quality.items():
            counter.inc(max(0, s[key]))
        self.results.inc(max(0, s["output_rows"]))
        if s["input_rate"] >= 0:
            self.input_rate.set(s["input_rate"])
        if watermark is not None:
            self.watermark.set(watermark)
        if s["lag"] is not None:
            self.set_lag({tp: max(0, n) for tp, n in s["lag_by_partition"].items()})

    # --- the state store poller ---------------------------------------------------------------

    def state_store(self, figures: StateStoreFigures, problem: str) -> None:
        """The state store's files now, and why it is degraded ("" when it is not)."""
        since = figures.unsnapshotted_since
        for key, value in (
            ("bytes", figures.bytes),
            ("files", figures.files),
            ("changelog_files", figures.changelogs),
            ("snapshot_files", figures.snapshots),
            ("snapshot_version", figures.snapshot_version),
            ("snapshot_lag_versions", figures.lag_versions),
            ("snapshot_age_seconds", 0.0 if since is None else max(0.0, self._wall() - since)),
            ("degraded", 1 if problem else 0),
        ):
            self.state[key].set(value)
        with self._lock:
            self._degraded = problem

    # --- the lag poller -----------------------------------------------------------------------

    def set_lag(self, lag: Mapping[TopicPartition, int] | None, error: str = "") -> None:
        """Records waiting per partition now; None when the brokers could not say (`error`)."""
        now = self._clock()
        if lag is not None:
            for (topic, partition), value in lag.items():
                self.lag.labels(topic=topic, partition=str(partition)).set(value)
        total = None if lag is None else sum(lag.values())
        with self._lock:
            self._lag, self._lag_error = total, error
            if total == 0:
                self._waiting_since = None
            elif self._waiting_since is None:
                self._waiting_since = now

    def current_positions(self) -> dict[TopicPartition, int]:
        """The counting query's next offset per partition after its last finished batch."""
        with self._lock:
            return dict(self.positions)

    def health(self) -> Health:
        """What /healthz answers now."""
        with self._lock:
            now = self._clock()
            since = max(self._since, self._waiting_since or self._since)
            facts = HealthFacts(
                now=now,
                running=self._running,
                stopping=self._stopping,
                failure=self._failure,
                restarting_in=None if self._restart_at is None else self._restart_at - now,
                since=since,
                lag=self._lag,
                lag_error=self._lag_error,
                degraded=self._degraded,
            )
        return judge_health(facts, self.stall_seconds)

    def _watermark_delay(self) -> float:
        with self._lock:
            mark = self._watermark
        return math.nan if mark is None else self._wall() - mark


class MetricsListener(ProgressListener):
    """Feeds Spark's query events to a JobMetrics (runs on the driver's listener thread)."""

    def __init__(self, metrics: JobMetrics) -> None:
        self.metrics = metrics

    def onQueryStarted(self, event: Any) -> None:  # noqa: N802 - Spark hook
        self.metrics.query_started(str(event.id), str(event.name))

    def onQueryProgress(self, event: Any) -> None:  # noqa: N802 - Spark hook
        try:
            self.metrics.progress(json.loads(event.progress.json))
        except Exception:  # a metrics bug must never fail the job's listener bus
            logger.exception("could not record a progress event in the metrics")

    def onQueryIdle(self, event: Any) -> None:  # noqa: N802 - Spark hook
        pass

    def onQueryTerminated(self, event: Any) -> None:  # noqa: N802 - Spark hook
        self.metrics.query_terminated(str(event.id), event.exception)
