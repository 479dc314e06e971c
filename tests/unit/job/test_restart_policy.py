"""Which query failures the restart strategy restarts, and which stop the job at once."""

from __future__ import annotations

import os
import signal
import threading
import time
from types import SimpleNamespace
from typing import Any

import pytest

from ipcount.config import load_settings
from ipcount.errors import TransactionAbortedError
from ipcount.faults import fault_point
from ipcount.job import runner
from ipcount.job.runner import is_fatal
from ipcount.job.running import JobQueries
from ipcount.observe.metrics import JobMetrics

# What Spark's StreamingQueryException text holds for a failure in the sink's commit (trimmed).
WRAPPED = (
    "[STREAM_FAILED] Query [id = 1, runId = 2] terminated with exception: ...\n"
    '  File "/x/ipcount/sink/txn.py", line 200, in commit_batch\n'
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
    monkeypatch: pytest.MonkeyPatch, start_job: Any, delay: float
) -> tuple[int, JobMetrics]:
    """runner._run with `start_job` in place of Spark's queries; its exit code and metrics."""
    monkeypatch.setattr(runner, "start_job", start_job)
    settings = load_settings(
        env={}, overrides=[f"job.restart_delay_seconds={delay}"], use_default_path=False
    )
    streams = SimpleNamespace(addListener=lambda _: None, removeListener=lambda _: None)
    metrics = JobMetrics()
    observed = SimpleNamespace(metrics=metrics, listener=object())
    session = SimpleNamespace(streams=streams)
    return runner._run(settings, observed, session, False, None, False, False), metrics


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
