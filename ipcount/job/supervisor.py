"""Running the job in the driver: start the queries, watch them, stop on a signal or a timeout,
restart failed queries in-process (Flink's failure-rate strategy: at most job.restart_attempts
restarts within job.restart_window_seconds); fatal failures stop at once."""

from __future__ import annotations

import logging
import signal
import threading
import time
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from types import FrameType
from typing import TYPE_CHECKING, Any

from ipcount.checkpoint.offset_log import local_path
from ipcount.config import RunMode, Settings
from ipcount.job.job_queries import JobQueries
from ipcount.job.pipeline import Prepared, preflight, prepare_start, start_job
from ipcount.job.restarts import RestartBudget

__all__ = ["run_job", "open_session", "is_fatal", "short_error"]

if TYPE_CHECKING:
    from pyspark.sql import SparkSession
    from pyspark.sql.streaming import StreamingQueryListener

    from ipcount.observe.endpoint import Observability
    from ipcount.observe.metrics import JobMetrics

logger = logging.getLogger(__name__)

# Data loss with failOnDataLoss=true: the source's DataLossError, or its older SourceError text.
_DATA_LOSS = ("DataLossError", "failOnDataLoss=false to ")
# Failures no restart can cure: restarting would fence the newer job, repeat a config error,
# write on over a hole in the sink's history; nor can it bring back records deleted unread.
_FATAL = (
    "ipcount.errors.FatalKafkaError",
    "ipcount.errors.SinkHistoryError",
    "ipcount.errors.ConfigError",
    "ipcount.errors.SchemaError",
    "FatalKafkaError:",
    "SinkHistoryError:",
    "ConfigError:",
    "SchemaError:",
    # Spark's own check that another query writes this checkpoint: the other job owns it.
    "CONCURRENT_STREAM_LOG_UPDATE",
    *_DATA_LOSS,
)


def is_fatal(error_text: str) -> bool:
    """Whether a query failure (its exception text, JVM trace included) is fatal."""
    return any(marker in error_text for marker in _FATAL)


def short_error(exc: BaseException) -> str:
    """The ipcount line of a (JVM-wrapped) query exception, else its first line."""
    text = str(exc)
    for line in text.splitlines():
        if "ipcount.errors." in line or "Error:" in line and "ipcount" in line:
            return line.strip()
    return text.splitlines()[0] if text else repr(exc)


class _Watch:
    """The wait loop's state: the stop request, the deadline, the restart budget."""

    def __init__(self, timeout: float | None, settings: Settings) -> None:
        self.stop = threading.Event()
        self.deadline = None if timeout is None else time.monotonic() + timeout
        self.timeout = timeout
        job = settings.job
        self.budget = RestartBudget(
            job.restart_attempts, job.restart_window_seconds, time.monotonic
        )

    def expired(self) -> bool:
        return self.deadline is not None and time.monotonic() > self.deadline


def _wait(queries: JobQueries, watch: _Watch) -> Exception | None:
    """Wait until the queries end, a stop is requested or the deadline passes; returns the first
    failed query's exception, or why the dead-letter query could not start (None otherwise): the
    restart policy decides on either."""
    while not watch.stop.is_set():
        for q in queries.all():
            if not q.isActive and q.exception() is not None:
                return q.exception()
        try:
            started = queries.advance()
        except Exception as exc:  # noqa: BLE001 - its start (sink history check, Spark) failed
            logger.error("the dead-letter query did not start: %s", short_error(exc))
            return exc
        if started:
            logger.info(
                "the counting query %s: the dead-letter query follows its batches",
                queries.started_because,
            )
        active = [q for q in queries.all() if q.isActive]
        if not active:
            return None
        if watch.expired():
            logger.info("run time of %gs reached: stopping", watch.timeout)
            return None
        try:
            # PySpark takes float seconds (its stub says int).
            active[0].awaitTermination(0.5)  # type: ignore[arg-type]
        except Exception as exc:  # it failed while we waited: the next round reads q.exception()
            logger.debug("query %s ended while waited on: %s", active[0].name, short_error(exc))
    return None


def _stop_all(queries: JobQueries) -> bool:
    """Stop what still runs; log every failure. Returns whether any query failed."""
    for q in queries.all():
        if q.isActive:
            q.stop()
    failed = False
    for q in queries.all():
        exc = q.exception()
        if exc is not None:
            failed = True
            logger.error("query %s failed: %s", q.name, short_error(exc))
    return failed


def run_job(
    settings: Settings,
    *,
    mode: RunMode = RunMode(),
    timeout: float | None = None,
    spark: SparkSession | None = None,
    prepared: Prepared | None = None,
    metrics_port: int | None = None,
) -> int:
    """Run the job until it ends (`mode.available_now`), `timeout` passes, SIGTERM/Ctrl-C, or a
    query fails for good (fatal, or more than job.restart_attempts restarts within
    job.restart_window_seconds).

    `spark`: a session of the caller's (else one is opened: `open_session`), and `prepared`
    what `open_session` prepared with it. `metrics_port`: serve /metrics and /healthz there
    (None: metrics.port; 0: off).

    Returns:
        0 when the queries stopped cleanly, 1 when one failed.

    Raises:
        SinkHistoryError: the checkpoint and the sink's history disagree (before any query runs).
        ConfigError: the metrics port cannot be bound.
    """
    from ipcount.observe.endpoint import Observability

    # Before Spark starts: a wrong setting or a missing topic fails in a second, not after ~15 s.
    preflight(settings)
    observed = Observability.maybe(settings, metrics_port)
    if observed is not None:
        observed.start()
    try:
        return _run(settings, observed, spark, prepared, mode, timeout)
    finally:
        if observed is not None:
            observed.stop()


def _run(
    settings: Settings,
    observed: Observability | None,
    spark: SparkSession | None,
    prepared: Prepared | None,
    mode: RunMode,
    timeout: float | None,
) -> int:
    from ipcount.job.jvm_archive import finish_training
    from ipcount.observe.listener import detach_listeners
    from ipcount.observe.progress import ProgressLogger

    if spark is None:
        session, prepared = open_session(settings, mode)
    else:
        session = spark
    listeners: list[StreamingQueryListener] = [ProgressLogger()]
    if observed is not None:
        listeners.append(observed.listener)
    for listener in listeners:
        session.streams.addListener(listener)
    metrics = observed.metrics if observed is not None else None
    watch = _Watch(timeout, settings)
    if metrics is not None:
        metrics.restart_budget(watch.budget.left)
    previous: dict[int, Any] = {}

    def _request_stop(signum: int, _frame: FrameType | None) -> None:
        logger.info(
            "received %s: stopping the queries (a micro-batch in flight is cancelled and replayed "
            "from its offsets at the next start; sink tasks' shares committed before the cancel "
            "stay committed, and the replay skips them)",
            signal.Signals(signum).name,
        )
        watch.stop.set()
        if metrics is not None:
            metrics.stopping()

    def _start() -> JobQueries:
        nonlocal prepared
        ahead, prepared = prepared, None
        return start_job(
            session,
            settings,
            mode=mode if watch.budget.total == 0 else mode.restarted(),
            checked=True,
            prepared=ahead,
        )

    def _remove_listeners() -> None:
        # Once they have handled the stopped queries' last events (observe.listener).
        detach_listeners(session, listeners)

    try:
        queries = _start()
    except BaseException:
        _remove_listeners()
        raise
    if metrics is not None:
        metrics.started()
    if threading.current_thread() is threading.main_thread():
        for sig in (signal.SIGTERM, signal.SIGINT):
            previous[sig] = signal.signal(sig, _request_stop)
    failed = False
    try:
        while True:
            error = _wait(queries, watch)
            failed = _stop_all(queries) or error is not None
            if error is None or not _restart_allowed(error, settings, watch, metrics):
                break
            queries = _start()
            failed = False
            if metrics is not None:
                metrics.started(restarted=True)
    finally:
        if metrics is not None:
            metrics.stopping()
        failed = _stop_all(queries) or failed
        _remove_listeners()
        for signum, handler in previous.items():
            signal.signal(signum, handler)
    if spark is None:
        finish_training(session)
    return 1 if failed else 0


def open_session(
    settings: Settings, mode: RunMode = RunMode(), extra: Mapping[str, str] | None = None
) -> tuple[SparkSession, Prepared | None]:
    """The job's Spark session (`extra`: more Spark settings), its Python workers started ahead
    (job.warmup), and, when the checkpoint is local, the start's Kafka side (`prepare_start`:
    fencing, the sink history check), done in a thread while the JVM and the session start: the
    two take seconds each and need nothing of each other. `ipcount run` starts this way, and so
    does the job under benchmark (bench.timed_job)."""
    from ipcount.job.session import build_session
    from ipcount.job.warmup import warm_python_workers

    if local_path(settings.job.checkpoint_location) is None:
        session = build_session(settings, extra, train_archive=True)
        warm_python_workers(session)
        return session, None
    with ThreadPoolExecutor(1, thread_name_prefix="ipcount-prepare") as pool:
        ahead = pool.submit(prepare_start, settings, mode=mode)
        session = build_session(settings, extra, train_archive=True)
        warm_python_workers(session)
        return session, ahead.result()


def _restart_allowed(
    error: BaseException, settings: Settings, watch: _Watch, metrics: JobMetrics | None = None
) -> bool:
    """Decide on one failure; sleeps the restart delay (interruptible) when restarting.
    `metrics`: the job's JobMetrics (None: off), told about the failure and the restart."""
    budget = watch.budget
    # A query's exception holds the JVM-wrapped trace with the Python class; an error raised here
    # (starting the dead-letter query) has its class only in its type.
    text = f"{type(error).__name__}: {error}"
    fatal = is_fatal(text)
    restarting = not fatal and budget.take()
    delay = settings.job.restart_delay_seconds
    if metrics is not None:
        metrics.failed(short_error(error), delay if restarting else None)
    if fatal and any(marker in text for marker in _DATA_LOSS):
        logger.error(
            "data loss, not restarting (a restart cannot bring deleted records back): %s",
            short_error(error),
        )
        return False
    if fatal:
        logger.error("fatal failure, not restarting: %s", short_error(error))
        return False
    if not restarting:
        logger.error(
            "the query failed after %d restart(s) in the window (%s): stopping",
            budget.made(),
            budget.describe(),
        )
        return False
    logger.warning(
        "restarting the query in %gs (restart %d of %d, %d left; %s) after: %s",
        delay,
        budget.made(),
        budget.attempts,
        budget.left(),
        budget.describe(),
        short_error(error),
    )
    if watch.stop.wait(delay) or watch.expired():
        return False
    return True
