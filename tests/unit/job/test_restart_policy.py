"""Which query failures the restart strategy restarts, and which stop the job at once."""

from __future__ import annotations

import pytest

from ipcount.errors import TransactionAbortedError
from ipcount.faults import fault_point
from ipcount.job.runner import is_fatal

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
