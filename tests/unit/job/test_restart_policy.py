"""Which query failures the restart strategy restarts, and which stop the job at once."""

from __future__ import annotations

import os
import signal
import threading
import time
from types import SimpleNamespace
from typing import Any

import pytest

from ipcount.config import RunMode, load_settings
from ipcount.errors import TransactionAbortedError
from ipcount.faults import fault_point
from ipcount.job import supervisor
from ipcount.job.job_queries import JobQueries
from ipcount.job.supervisor import is_fatal
from ipcount.observe.metrics import JobMetrics

# What Spark's StreamingQueryException text holds for a failure in the sink's commit (trimmed).
WRAPPED = (
    "[STREAM_FAILED] Query [id = 1, runId = 2] terminated with exception: ...\n"
    '  File "/x/ipcount/sink/transaction.py", line 200, in commit_batch\n'
    "ipcount.errors.{name}: batch 7: ...\n\tat org.apache.spark.api.python..."
)


@pytest.mark.parametrize(
    "name", ["FatalKafkaError", "SinkHistoryError", "ConfigError", "SchemaError"]
)
def test_fatal_failures_are_not_restarted(name: str) -> None:
    assert is_fatal(WRAPPED.format(name=name))


@pytest.mark.parametrize("name", ["TransactionAbortedError", "SinkError", "SourceError"])
def test_abortable_and_retriable_failures_are_restarted(name: str) -> None:
    assert not is_fatal(WRAPPED.format(name=name))
    assert not is_fatal("java.io.IOException: Connection reset by peer")


def test_spark_s_concurrent_checkpoint_check_is_fatal() -> None:
    assert is_fatal("[CONCURRENT_STREAM_LOG_UPDATE] Concurrent update to the log.")


def test_an_abort_fault_fires_once_per_job(monkeypatch, tmp_path) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.setenv("IPCOUNT_FAULTS", "sink.before_commit@3/abort")
    monkeypatch.setenv("IPCOUNT_FAULTS_STATE", str(tmp_path))
    fault_point("sink.before_commit", 2)  # another batch: nothing
    with pytest.raises(TransactionAbortedError):
        fault_point("sink.before_commit", 3)
    fault_point("sink.before_commit", 3)  # the replay goes through
    assert [p.name for p in tmp_path.iterdir()] == ["sink.before_commit@3_abort.fired"]


class _Query:
    """A query that has already ended, failed (`error`) or cleanly."""

    name = "ipcount"
    isActive = False  # noqa: N815 - Spark's name

    def __init__(self, error: str | None) -> None:
        self.error = error

    def exception(self) -> str | None:
        return self.error

    def stop(self) -> None:
        pass


def _run_job(monkeypatch: pytest.MonkeyPatch, delay: float) -> tuple[int, JobMetrics, list[Any]]:
    """The runner's loop, without Spark: the first query fails, a restarted one ends cleanly."""
    outcomes = ["SourceError: broker went away", None]
    started: list[Any] = []

    def start_job(*args: Any, **kwargs: Any) -> JobQueries:
        started.append(outcomes[len(started)])
        return JobQueries(counts=_Query(started[-1]))

    code, metrics = _run_runner(monkeypatch, start_job, delay)
    return code, metrics, started


def _run_runner(
    monkeypatch: pytest.MonkeyPatch,
    start_job: Any,
    delay: float,
    overrides: tuple[str, ...] = (),
    mode: RunMode = RunMode(),
) -> tuple[int, JobMetrics]:
    """supervisor._run with `start_job` in place of Spark's queries; its exit code and metrics."""
    monkeypatch.setattr(supervisor, "start_job", start_job)
    settings = load_settings(
        env={},
        overrides=[f"job.restart_delay_seconds={delay}", *overrides],
        use_default_path=False,
    )
    streams = SimpleNamespace(addListener=lambda _: None, removeListener=lambda _: None)
    metrics = JobMetrics()
    observed = SimpleNamespace(metrics=metrics, listener=object())
    session = SimpleNamespace(streams=streams)
    return supervisor._run(settings, observed, session, None, mode, None), metrics


def test_a_new_query_is_new_only_at_its_first_start(monkeypatch: pytest.MonkeyPatch) -> None:
    # `ipcount run --new-query`: the first start adopts the other query's output; the restart
    # after a failure resumes the checkpoint that start made, so it is no longer a new query.
    modes: list[RunMode] = []

    def start_job(*args: Any, mode: RunMode, **kwargs: Any) -> JobQueries:
        modes.append(mode)
        return JobQueries(
            counts=_Query("SourceError: broker went away" if len(modes) == 1 else None)
        )

    code, _ = _run_runner(monkeypatch, start_job, 0, mode=RunMode(new_query=True))
    assert code == 0
    assert [m.new_query for m in modes] == [True, False]


def _restarts(metrics: JobMetrics) -> float | None:
    return metrics.registry.get_sample_value("ipcount_query_restarts_total")


def test_a_restart_counts_when_the_query_restarts(monkeypatch: pytest.MonkeyPatch) -> None:
    code, metrics, started = _run_job(monkeypatch, delay=0)
    assert (code, len(started)) == (0, 2)
    assert _restarts(metrics) == 1


def test_a_stop_during_the_restart_delay_is_no_restart(monkeypatch: pytest.MonkeyPatch) -> None:
    sigterm = threading.Timer(0.5, os.kill, (os.getpid(), signal.SIGTERM))
    sigterm.start()
    t0 = time.monotonic()
    try:
        code, metrics, started = _run_job(monkeypatch, delay=30)
    finally:
        sigterm.cancel()
    assert time.monotonic() - t0 < 10  # SIGTERM cut the delay short
    assert (code, len(started)) == (1, 1)
    assert _restarts(metrics) == 0


def _run_with_dead_letter_start(
    monkeypatch: pytest.MonkeyPatch, failure: Exception
) -> tuple[int, JobMetrics, list[Any]]:
    """The runner's loop, without Spark: the counting query ends cleanly, and starting the
    dead-letter query beside it fails once with `failure`; after a restart it starts."""
    started: list[Any] = []

    def start_dead_letter() -> Any:
        if len(started) == 1:
            raise failure
        return _Query(None)

    def start_job(*args: Any, **kwargs: Any) -> JobQueries:
        started.append(object())
        return JobQueries(counts=_Query(None), pending=start_dead_letter)

    code, metrics = _run_runner(monkeypatch, start_job, 0)
    return code, metrics, started


def test_a_dead_letter_query_that_fails_to_start_is_restarted_like_a_failed_query(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Its start checks the dead-letter topic's history on the broker: a broker that does not
    answer in time must not end `ipcount run` at once, past job.restart_attempts."""
    from ipcount.errors import BrokerError

    code, metrics, started = _run_with_dead_letter_start(
        monkeypatch, BrokerError("cannot query the end of ip_count_dead_letter[0]: timed out")
    )
    assert (code, len(started)) == (0, 2)
    assert _restarts(metrics) == 1


def test_a_fatal_failure_to_start_the_dead_letter_query_stops_the_job(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from ipcount.errors import SinkHistoryError

    code, metrics, started = _run_with_dead_letter_start(
        monkeypatch, SinkHistoryError("the checkpoint and the dead-letter topic disagree")
    )
    assert (code, len(started)) == (1, 1)
    assert _restarts(metrics) == 0


class _Clock:
    """A monotonic clock the test moves; stands in for the runner's `time` module."""

    def __init__(self) -> None:
        self.now = 1000.0

    def monotonic(self) -> float:
        return self.now

    @staticmethod
    def sleep(seconds: float) -> None:
        pass


def _run_failing(
    monkeypatch: pytest.MonkeyPatch, failed_at: list[float], overrides: tuple[str, ...] = ()
) -> tuple[int, JobMetrics, list[Any]]:
    """The runner's loop, without Spark, on an injected clock: the query started n-th fails at
    `failed_at[n]` seconds (clock time), the one after the last ends cleanly."""
    clock = _Clock()
    monkeypatch.setattr(supervisor, "time", clock)
    started: list[Any] = []

    def start_job(*args: Any, **kwargs: Any) -> JobQueries:
        n = len(started)
        if n < len(failed_at):
            clock.now = failed_at[n]
        started.append(f"SourceError: broker went away ({n})" if n < len(failed_at) else None)
        return JobQueries(counts=_Query(started[-1]))

    code, metrics = _run_runner(monkeypatch, start_job, 0, overrides)
    return code, metrics, started


def _left(metrics: JobMetrics) -> float | None:
    return metrics.registry.get_sample_value("ipcount_query_restarts_left")


DAY = 86400.0


def test_transient_failures_weeks_apart_never_add_up_to_a_stop(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """A job that lives through five rolling broker upgrades, a week apart, is restarted each time:
    the budget (3 restarts) counts within job.restart_window_seconds, not over the job's life."""
    caplog.set_level("WARNING", logger="ipcount.job.supervisor")
    code, metrics, started = _run_failing(monkeypatch, [w * 7 * DAY for w in range(1, 6)])
    assert (code, len(started)) == (0, 6)
    assert _restarts(metrics) == 5
    assert _left(metrics) == 2  # the last restart is the only one in the window
    lines = [r.getMessage() for r in caplog.records if "restarting the query" in r.getMessage()]
    assert len(lines) == 5
    assert "2 left" in lines[-1], lines[-1]


def test_a_query_that_keeps_failing_stops_after_the_budget(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """The seed's shape by default: a fourth failure within the window stops the job (exit 1)."""
    caplog.set_level("WARNING", logger="ipcount.job.supervisor")
    code, metrics, started = _run_failing(monkeypatch, [0.0, 12.0, 24.0, 36.0, 48.0])
    assert (code, len(started)) == (1, 4)
    assert _restarts(metrics) == 3
    assert _left(metrics) == 0
    text = caplog.text
    assert "0 left" in text
    assert "failed after 3 restart(s)" in text and "job.restart_window_seconds" in text


def test_a_restart_leaves_the_window_after_restart_window_seconds(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Three restarts in a row, then a failure just past the first restart's window: restarted
    (the first one left the window); one more at once: three in the window, stop."""
    window = 600.0
    code, metrics, started = _run_failing(
        monkeypatch,
        [0.0, 10.0, 20.0, window + 0.5, window + 1.0],
        overrides=(f"job.restart_window_seconds={window}",),
    )
    assert (code, len(started)) == (1, 5)
    assert _restarts(metrics) == 4


def test_a_window_of_zero_counts_restarts_over_the_job_s_life(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """job.restart_window_seconds = 0: Flink's fixed-delay strategy (the seed's behaviour)."""
    code, metrics, started = _run_failing(
        monkeypatch, [w * 7 * DAY for w in range(1, 6)], overrides=("job.restart_window_seconds=0",)
    )
    assert (code, len(started)) == (1, 4)


# What a read task's data-loss failure looks like to the driver (the JVM wraps the Python error).
DATA_LOSS = (
    "[STREAM_FAILED] Query [id = 1, runId = 2] terminated with exception: Job aborted due to "
    "stage failure: ... org.apache.spark.api.python.PythonException: Traceback ...\n"
    '  File "/x/ipcount/source/partition_reader.py", line 244, in _handle_read_error\n'
    "ipcount.errors.{name}: data loss in ip_count_source/0 while reading 1139-6000: offsets "
    "1139-2973 were deleted (log now starts at 2974). Set option failOnDataLoss=false to skip "
    "lost offsets\n\tat org.apache.spark.api.python..."
)


@pytest.mark.parametrize("name", ["SourceError", "DataLossError"])
def test_data_loss_stops_the_job_at_once(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture, name: str
) -> None:
    """failOnDataLoss=true: a restart cannot bring deleted records back, so the job exits 1 at
    once (no restart, no delay) with one message that says what was lost and how to go on."""
    caplog.set_level("ERROR", logger="ipcount.job.supervisor")
    started: list[Any] = []

    def start_job(*args: Any, **kwargs: Any) -> JobQueries:
        started.append(object())
        return JobQueries(counts=_Query(DATA_LOSS.format(name=name) if len(started) == 1 else None))

    t0 = time.monotonic()
    code, metrics = _run_runner(monkeypatch, start_job, 30)
    assert time.monotonic() - t0 < 5  # no restart delay
    assert (code, len(started)) == (1, 1)
    assert _restarts(metrics) == 0
    stops = [r.getMessage() for r in caplog.records if "not restarting" in r.getMessage()]
    assert len(stops) == 1 and "offsets 1139-2973 were deleted" in stops[0], stops
    assert "failOnDataLoss=false" in stops[0]


def test_the_driver_s_data_loss_check_is_fatal_too() -> None:
    """The driver's check when it plans a batch (source/reader.py), raised in Spark's Python source."""
    assert is_fatal(
        "ipcount.errors.SourceError: data loss: partition ip_count_source/0: offsets 1139-2973 "
        "were deleted before they were read (log now starts at 2974). Set option "
        "failOnDataLoss=false to continue past it"
    )
    assert is_fatal("DataLossError: partition ip_count_source/0: offsets 1139-2973 were deleted")
