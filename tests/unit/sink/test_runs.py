"""The order of a query's starts as one read of the progress topic finds it (sink.runs): the
one-key history, announcements of earlier versions (one key per start) and their tombstones."""

from __future__ import annotations

import json

from ipcount.sink.marker import ProgressMarker
from ipcount.sink.runs import ProgressView, RunHistory


def _legacy(query: str, run: str) -> tuple[bytes, bytes]:
    body = {"kind": "run", "queryId": query, "runId": run}
    return f"{query}#run#{run}".encode(), json.dumps(body).encode()


def _read(records: list[tuple[bytes | None, bytes | None]]) -> ProgressView:
    view = ProgressView()
    for offset, (key, value) in enumerate(records):
        view.add(key, value, (0, offset, f"progress/0@{offset}"))
    return view


def test_earlier_announcements_then_the_history_then_their_tombstones() -> None:
    q = "q1"
    history = RunHistory(q, ("r1", "r2", "r3"))
    view = _read(
        [
            _legacy(q, "r1"),
            _legacy(q, "r2"),
            _legacy("q2", "x"),
            (RunHistory.key(q).encode(), history.encode()),
            (f"{q}#run#r1".encode(), None),
            (f"{q}#run#r2".encode(), None),
        ]
    )
    assert view.runs[q] == ["r1", "r2", "r3"]
    assert view.legacy[q] == []  # cleared: compaction drops them
    assert view.runs["q2"] == ["x"] and view.legacy["q2"] == ["q2#run#x"]
    assert view.markers == {}


def test_the_newest_history_wins_and_markers_are_read_beside_it() -> None:
    q = "q1"
    marker = ProgressMarker(q, 4, run_id="r2")
    view = _read(
        [
            (RunHistory.key(q).encode(), RunHistory(q, ("r1",)).encode()),
            (marker.key, marker.encode()),
            (RunHistory.key(q).encode(), RunHistory(q, ("r1", "r2")).encode()),
        ]
    )
    assert view.runs[q] == ["r1", "r2"]
    assert view.markers[q] == marker and view.markers[q].position == (0, 1)


def test_a_history_round_trips_and_foreign_values_are_ignored() -> None:
    h = RunHistory("q", ("a", "b"))
    assert RunHistory.decode(h.encode()) == h
    assert RunHistory.decode(b"not json") is None
    assert RunHistory.decode(b'{"kind": "run", "queryId": "q", "runId": "a"}') is None
