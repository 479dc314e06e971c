"""When the dead-letter query starts: in a live run once the counting query has caught up with its
source (or ran a while under steady load), under AvailableNow after the counting query's end,
never after a failure or a stop."""

from __future__ import annotations

import uuid
from typing import Any

from pyspark.sql.streaming.listener import StreamingQueryProgress

from ipcount.job.job_queries import DEAD_LETTER_START_SECONDS, JobQueries
from ipcount.queries import QUALITY_METRICS


class _Counts:
    """The counting query as the runner sees it: active or not, its last progress, its error."""

    def __init__(self) -> None:
        self.isActive = True  # noqa: N815 - Spark's name
        self.lastProgress: Any = None  # noqa: N815
        self.error: str | None = None

    def exception(self) -> str | None:
        return self.error


def _queries(counts: _Counts, *, live: bool) -> tuple[JobQueries, list[str]]:
    started: list[str] = []

    def start() -> Any:
        started.append("dead-letter")
        return "dead-letter query"

    return JobQueries(counts, pending=start, live=live), started  # type: ignore[arg-type]


def _batch(batch_id: int, records: int, lag: int = 0) -> StreamingQueryProgress:
    """A progress as StreamingQuery.lastProgress gives it (observed metrics as Rows)."""
    return StreamingQueryProgress.fromJson(
        {
            "id": str(uuid.UUID(int=1)),
            "runId": str(uuid.UUID(int=2)),
            "name": "ipcount",
            "timestamp": "2026-11-26T08:00:00.000Z",
            "batchId": batch_id,
            "batchDuration": 1000,
            "stateOperators": [],
            "sources": [
                {
                    "description": "ipcount-kafka",
                    "startOffset": None,
                    "endOffset": {"offsets": {"access": {"0": 1_000 * batch_id}}},
                    "latestOffset": {"lag": {"access": {"0": lag}}},
                    "numInputRows": records,
                    "inputRowsPerSecond": 0.0,
                    "processedRowsPerSecond": 0.0,
                    "metrics": {},
                }
            ],
            "sink": {"description": "ipcount-kafka-txn", "numOutputRows": 0},
            "numInputRows": records,
            "observedMetrics": {QUALITY_METRICS: {"records": records, "heartbeats": 0}},
        }
    )


def test_a_live_run_starts_it_once_the_counting_query_read_no_new_records() -> None:
    counts = _Counts()
    queries, started = _queries(counts, live=True)
    assert not queries.advance(now=0.0) and started == []  # its first batch still runs
    counts.lastProgress = _batch(0, 1_000_096)  # a backlog: its results come first
    assert not queries.advance(now=1.0) and started == []
    counts.lastProgress = _batch(1, 0)  # caught up (the batch that emits the backlog's windows)
    assert queries.advance(now=2.0) and queries.dead_letter == "dead-letter query"
    assert queries.started_because == "caught up with its source"
    assert not queries.advance(now=3.0) and started == ["dead-letter"]  # once


def test_a_live_run_under_steady_load_starts_it_once_a_batch_left_nothing_behind() -> None:
    counts = _Counts()
    queries, started = _queries(counts, live=True)
    counts.lastProgress = _batch(0, 500_000, lag=0)  # a backlog, read whole: applied next batch
    assert not queries.advance(now=100.0)
    counts.lastProgress = _batch(1, 20_000, lag=0)  # steady traffic, read as it comes
    assert queries.advance(now=101.0) and started == ["dead-letter"]


def test_a_source_never_caught_up_with_gets_it_a_while_after_the_first_batch() -> None:
    counts = _Counts()
    queries, started = _queries(counts, live=True)
    counts.lastProgress = _batch(0, 10_000_000, lag=40_000_000)
    assert not queries.advance(now=100.0)
    counts.lastProgress = _batch(7, 10_000_000, lag=5_000_000)  # every batch leaves records
    assert not queries.advance(now=100.0 + DEAD_LETTER_START_SECONDS - 1)
    assert queries.advance(now=100.0 + DEAD_LETTER_START_SECONDS) and started == ["dead-letter"]
    # Said as it is: not "caught up".
    assert queries.started_because == "has run 30 s without catching up"


def test_a_live_run_stopped_or_failed_before_a_batch_never_starts_it() -> None:
    counts = _Counts()
    queries, started = _queries(counts, live=True)
    counts.isActive, counts.lastProgress = False, _batch(0, 0)
    assert not queries.advance()
    counts.error = "SourceError: broker went away"
    assert not queries.advance() and started == [] and queries.dead_letter is None


def test_available_now_starts_it_only_once_the_counting_query_ended_cleanly() -> None:
    counts = _Counts()
    queries, started = _queries(counts, live=False)
    counts.lastProgress = _batch(0, 0)
    assert not queries.advance()  # it may still plan batches to follow
    counts.isActive = False
    assert queries.advance() and started == ["dead-letter"]
    assert queries.started_because == "is done"
    failed = _Counts()
    failed.isActive, failed.error = False, "boom"
    queries, started = _queries(failed, live=False)
    assert not queries.advance() and started == []
