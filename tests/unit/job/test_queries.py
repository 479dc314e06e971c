"""When the dead-letter query starts: after the counting query's first micro-batch in a live run,
after the counting query's end under AvailableNow, never after a failure or a stop."""

from __future__ import annotations

from typing import Any

from ipcount.job.pipeline import JobQueries


class _Counts:
    """The counting query as the runner sees it: active or not, its last progress, its error."""

    def __init__(self) -> None:
        self.isActive = True  # noqa: N815 - Spark's name
        self.lastProgress: dict[str, Any] | None = None  # noqa: N815
        self.error: str | None = None

    def exception(self) -> str | None:
        return self.error


def _queries(counts: _Counts, *, live: bool) -> tuple[JobQueries, list[str]]:
    started: list[str] = []

    def start() -> Any:
        started.append("dead-letter")
        return "dead-letter query"

    return JobQueries(counts, pending=start, live=live), started  # type: ignore[arg-type]


def test_a_live_run_starts_it_once_the_counting_query_finished_a_micro_batch() -> None:
    counts = _Counts()
    queries, started = _queries(counts, live=True)
    assert not queries.advance() and started == []  # its first batch still runs
    counts.lastProgress = {"batchId": 0}
    assert queries.advance() and queries.dead_letter == "dead-letter query"
    assert not queries.advance() and started == ["dead-letter"]  # once


def test_a_live_run_stopped_or_failed_before_a_batch_never_starts_it() -> None:
    counts = _Counts()
    queries, started = _queries(counts, live=True)
    counts.isActive, counts.lastProgress = False, {"batchId": 0}
    assert not queries.advance()
    counts.error = "SourceError: broker went away"
    assert not queries.advance() and started == [] and queries.dead_letter is None


def test_available_now_starts_it_only_once_the_counting_query_ended_cleanly() -> None:
    counts = _Counts()
    queries, started = _queries(counts, live=False)
    counts.lastProgress = {"batchId": 0}
    assert not queries.advance()  # it may still plan batches to follow
    counts.isActive = False
    assert queries.advance() and started == ["dead-letter"]
    failed = _Counts()
    failed.isActive, failed.error = False, "boom"
    queries, started = _queries(failed, live=False)
    assert not queries.advance() and started == []
