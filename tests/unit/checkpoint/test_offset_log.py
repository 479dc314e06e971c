"""The source finds, in its query's offset log, the watermark a batch judges late records by."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ipcount.checkpoint.offset_log import OffsetLog, check_readable
from ipcount.errors import ConfigError, SourceError


def _entry(ckpt: Path, batch: int, watermark: int, offsets: dict) -> None:
    (ckpt / "offsets").mkdir(parents=True, exist_ok=True)
    meta = {"batchWatermarkMs": watermark, "batchTimestampMs": 1, "conf": {}}
    text = f"v1\n{json.dumps(meta)}\n{json.dumps(offsets)}"
    (ckpt / "offsets" / str(batch)).write_text(text)
    (ckpt / "offsets" / f".{batch}.crc").write_text("x")  # Hadoop's checksum files are ignored


def _end(n: int) -> dict:
    return {"offsets": {"src": {"0": n}}}


def test_the_previous_batchs_watermark_judges_late_records(tmp_path: Path) -> None:
    _entry(tmp_path, 0, 0, _end(10))
    _entry(tmp_path, 1, 5_000, _end(20))
    _entry(tmp_path, 2, 9_000, _end(30))
    log = OffsetLog(str(tmp_path))
    assert log.watermarks_for(_end(10)).late_before_ms == 0  # the first batch: nothing is late
    marks = log.watermarks_for(_end(30))
    assert (marks.batch_id, marks.watermark_ms, marks.late_before_ms) == (2, 9_000, 5_000)


def test_an_idle_batch_repeating_offsets_is_the_newest_match(tmp_path: Path) -> None:
    _entry(tmp_path, 0, 0, _end(10))
    _entry(tmp_path, 1, 5_000, _end(10))  # no new data; the watermark moved
    marks = OffsetLog(f"file://{tmp_path}").watermarks_for(_end(10))
    assert (marks.batch_id, marks.late_before_ms) == (1, 0)


def test_a_checkpoint_of_another_query_is_refused(tmp_path: Path) -> None:
    _entry(tmp_path, 0, 0, _end(10))
    with pytest.raises(SourceError, match="queryCheckpoint must be this query's own"):
        OffsetLog(str(tmp_path)).watermarks_for(_end(99))


def test_a_checkpoint_python_cannot_read_is_refused_at_start() -> None:
    with pytest.raises(ConfigError, match="job.late_corrections = false"):
        check_readable("nosuchscheme://bucket/checkpoint")


def test_the_last_committed_batch_is_the_newest_in_the_commit_log(tmp_path: Path) -> None:
    log = OffsetLog(str(tmp_path))
    assert log.last_committed() is None  # no commit log yet
    (tmp_path / "commits").mkdir()
    for batch in (0, 1, 10, 2):
        (tmp_path / "commits" / str(batch)).write_text('v1\n{"nextBatchWatermarkMs":0}')
    (tmp_path / "commits" / ".10.crc").write_text("x")
    assert log.last_committed() == 10


def test_the_query_id_is_the_checkpoint_s_metadata_id(tmp_path: Path) -> None:
    log = OffsetLog(str(tmp_path))
    assert log.query_id() is None  # before the query's first start
    (tmp_path / "metadata").write_text('{"id":"5f1d0c1e-q"}\n')
    assert log.query_id() == "5f1d0c1e-q"
    (tmp_path / "metadata").write_text("not json")
    with pytest.raises(SourceError, match="metadata is unreadable"):
        log.query_id()
