"""The sink's history rules against a checkpoint (no broker: markers and checkpoints are built)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ipcount.checkpoint.receipts import KEEP, Receipt, ReceiptLog
from ipcount.errors import SinkHistoryError
from ipcount.sink.history import (
    check_checkpoint,
    check_replay,
    other_query_output,
    starting_offsets_after,
)
from ipcount.sink.marker import JsonValue, ProgressMarker


def _end(n: int) -> dict[str, JsonValue]:
    return {"offsets": {"src": {"0": n, "1": n}}}


def _marker(batch: int, n: int, query: str = "q1", topic: str = "sink") -> ProgressMarker:
    return ProgressMarker(
        query_id=query,
        batch_id=batch,
        topic=topic,
        source_end=_end(n),
        committed_at_ms=1_700_000_000_000 + batch,
    )


def _checkpoint(root: Path, ends: list[int]) -> str:
    (root / "offsets").mkdir(parents=True)
    for batch, n in enumerate(ends):
        meta = json.dumps({"batchWatermarkMs": 0, "batchTimestampMs": 0, "conf": {}})
        (root / "offsets" / str(batch)).write_text(f"v1\n{meta}\n{json.dumps(_end(n))}")
    return str(root)


def test_a_receipt_newer_than_the_marker_is_a_lost_commit(tmp_path: Path) -> None:
    ckpt = _checkpoint(tmp_path, [10, 20, 30])
    ReceiptLog(ckpt).write(Receipt(1, 7, _end(20), 1))
    ReceiptLog(ckpt).write(Receipt(2, 5, _end(30), 2))
    check_checkpoint(_marker(2, 30), ckpt, "sink")  # the broker has both: fine
    with pytest.raises(SinkHistoryError, match="lost a committed batch.*batch 2 \\(5 records"):
        check_checkpoint(_marker(1, 20), ckpt, "sink")
    with pytest.raises(SinkHistoryError, match="newest progress marker .* is none"):
        check_checkpoint(None, ckpt, "sink")


def test_an_older_or_different_checkpoint_is_refused(tmp_path: Path) -> None:
    older = _checkpoint(tmp_path / "a", [10, 20])
    with pytest.raises(
        SinkHistoryError, match="older than the sink's history: Spark is at batch 1"
    ):
        check_checkpoint(_marker(2, 30), older, "sink")
    other = _checkpoint(tmp_path / "b", [10, 20, 99])
    with pytest.raises(SinkHistoryError, match="does not match the sink's history"):
        check_checkpoint(_marker(2, 30), other, "sink")
    after_kill = _checkpoint(tmp_path / "c", [10, 20, 30])  # batch 2 committed, not in commits/
    check_checkpoint(_marker(2, 30), after_kill, "sink")


def test_only_the_committed_batch_over_the_same_offsets_is_skipped() -> None:
    marker = _marker(5, 50)
    check_replay(5, {**_end(50), "heartbeat": {"seq": 1, "ts": 2, "base": 3}}, marker, "c", "sink")
    with pytest.raises(SinkHistoryError, match="its batch 5 consumed"):
        check_replay(5, _end(49), marker, "c", "sink")
    with pytest.raises(SinkHistoryError, match="Spark is at batch 4") as older:
        check_replay(4, _end(40), marker, "c", "sink")
    # Found while running: a second process on the same checkpoint is the likely cause.
    assert "If another process runs this query on the same checkpoint" in str(older.value)


def test_another_querys_output_on_the_same_sink_and_source() -> None:
    markers = {
        "q1": _marker(9, 90),
        "dlq": _marker(3, 90, query="dlq", topic="dead"),
        "old": ProgressMarker("old", 1),  # an older ipcount's marker: not judged
    }
    assert other_query_output(markers, "q2", "sink", ["src"]) == markers["q1"]
    assert other_query_output(markers, "q1", "sink", ["src"]) is None
    assert other_query_output(markers, "q2", "sink", ["another-source"]) is None
    assert json.loads(starting_offsets_after(markers["q1"])) == {"src": {"0": 90, "1": 90}}


def test_receipts_keep_the_newest(tmp_path: Path) -> None:
    log = ReceiptLog(str(tmp_path))
    for batch in range(KEEP + 5):
        log.write(Receipt(batch, 1, None, 0))
    assert log.batch_ids() == list(range(5, KEEP + 5))
    assert ReceiptLog("s3://bucket/ckpt").enabled is False
