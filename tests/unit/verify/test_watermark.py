"""Where `ipcount verify` reads how far the job has emitted: the sink's progress markers, else
the checkpoint of a query that wrote the sink (no broker: markers and checkpoints are built here)."""

from __future__ import annotations

import json
from pathlib import Path

from ipcount.sink.marker import ProgressMarker
from ipcount.verify.watermark import checkpoint_watermark, marker_watermark

W = 5000


def _marker(qid: str, batch: int, topic: str, wm: int | None = None) -> ProgressMarker:
    return ProgressMarker(qid, batch, topic=topic, watermark_ms=wm)


def test_marker_watermark_is_the_newest_of_the_queries_that_wrote_the_sink() -> None:
    markers = {
        "a": _marker("a", 4, "sink", 10 * W),
        "b": _marker("b", 9, "sink", 12 * W),
        "dlq": _marker("dlq", 20, "dead", 99 * W),  # the dead-letter query: another topic
    }
    mark = marker_watermark(markers, "sink")
    assert mark is not None and mark.ms == 12 * W
    assert "query b" in mark.source and "batch 9" in mark.source
    # Markers of an older ipcount carry no watermark: unknown, not zero.
    assert marker_watermark({"a": _marker("a", 4, "sink")}, "sink") is None
    assert marker_watermark({}, "sink") is None


def _checkpoint(root: Path, qid: str, watermarks: list[int], committed: int) -> str:
    (root / "offsets").mkdir(parents=True)
    (root / "commits").mkdir()
    (root / "metadata").write_text(json.dumps({"id": qid}))
    for batch, wm in enumerate(watermarks):
        meta = {"batchWatermarkMs": wm, "batchTimestampMs": 1}
        (root / "offsets" / str(batch)).write_text(f"v1\n{json.dumps(meta)}\n{{}}\n")
    for batch in range(committed + 1):
        (root / "commits" / str(batch)).write_text('v1\n{"nextBatchWatermarkMs":0}\n')
    return str(root)


def test_checkpoint_watermark_is_the_last_committed_batch_of_that_query(tmp_path: Path) -> None:
    ckpt = _checkpoint(tmp_path / "c", "q1", [0, 3 * W, 5 * W], committed=1)
    markers = {"q1": _marker("q1", 1, "sink")}
    mark = checkpoint_watermark(ckpt, markers, "sink")
    assert (
        mark is not None and mark.ms == 3 * W and "batch 1" in mark.source and ckpt in mark.source
    )
    # The checkpoint of a query that did not write this sink says nothing about it.
    assert checkpoint_watermark(ckpt, {"q2": _marker("q2", 1, "sink")}, "sink") is None
    assert checkpoint_watermark(str(tmp_path / "none"), markers, "sink") is None
