"""Clean-range markers (source.clean_ranges): keyed by range and batch time, written atomically,
only under a local checkpoint, and never left to accumulate."""

from __future__ import annotations

import json
from pathlib import Path

from ipcount.source.clean_ranges import (
    is_clean,
    mark_clean,
    prune_passed,
    prune_retired,
    unmark,
)
from ipcount.source.offsets import OffsetRange, SourceOffset


def _files(ckpt: Path) -> list[str]:
    root = ckpt / "clean-ranges"
    return sorted(str(p.relative_to(root)) for p in root.rglob("*") if p.is_file())


def test_a_marker_matches_only_its_range_and_batch_time(tmp_path: Path) -> None:
    ckpt = str(tmp_path)
    rng = OffsetRange("logs.v1", 2, 100, 200)
    mark_clean(ckpt, rng, 5_000)
    assert is_clean(ckpt, rng, 5_000)
    assert not is_clean(ckpt, rng, 5_001)
    assert not is_clean(ckpt, rng, None)
    assert not is_clean(ckpt, OffsetRange("logs.v1", 2, 100, 199), 5_000)
    assert not is_clean(ckpt, OffsetRange("logs.v1", 1, 100, 200), 5_000)
    assert not is_clean(ckpt, OffsetRange("logs", 2, 100, 200), 5_000)
    mark_clean(ckpt, rng, None)
    assert is_clean(ckpt, rng, None)
    # Written by rename: no temporary file is left behind.
    assert all(not name.split("/")[-1].startswith(".") for name in _files(tmp_path))
    unmark(ckpt, rng, 5_000)
    assert not is_clean(ckpt, rng, 5_000)
    unmark(ckpt, rng, 5_000)  # already gone: fine


def test_an_unreadable_or_foreign_marker_is_not_trusted(tmp_path: Path) -> None:
    ckpt = str(tmp_path)
    rng = OffsetRange("t", 0, 0, 10)
    mark_clean(ckpt, rng, 1)
    (path,) = (tmp_path / "clean-ranges").rglob("0-0-10-*")
    path.write_text("{not json")
    assert not is_clean(ckpt, rng, 1)
    path.write_text(json.dumps({"topic": "t", "partition": 0, "start": 0, "end": 10}))
    assert not is_clean(ckpt, rng, 1)


def test_no_markers_on_a_remote_or_missing_checkpoint(tmp_path: Path) -> None:
    rng = OffsetRange("t", 0, 0, 10)
    for ckpt in ("s3a://bucket/ckpt", "hdfs://nn/ckpt", ""):
        mark_clean(ckpt, rng, 1)
        assert not is_clean(ckpt, rng, 1)
        assert prune_passed(ckpt, {("t", 0): 10}) == 0
        assert prune_retired(ckpt) == 0
    mark_clean(f"file://{tmp_path}", rng, 1)
    assert is_clean(str(tmp_path), rng, 1)


def test_markers_the_dead_letter_query_has_passed_are_deleted(tmp_path: Path) -> None:
    ckpt = str(tmp_path)
    for start, end in ((0, 10), (10, 20), (20, 30)):
        mark_clean(ckpt, OffsetRange("t", 0, start, end), 7)
        mark_clean(ckpt, OffsetRange("t", 1, start, end), 7)
    assert prune_passed(ckpt, {("t", 0): 20, ("t", 1): 5}) == 2
    assert _files(tmp_path) == sorted(["t/0-20-30-7", "t/1-0-10-7", "t/1-10-20-7", "t/1-20-30-7"])


def test_markers_older_than_the_offset_log_retention_are_deleted(tmp_path: Path) -> None:
    ckpt = str(tmp_path)
    for start, end in ((0, 10), (10, 20), (20, 30), (30, 40)):
        mark_clean(ckpt, OffsetRange("t", 0, start, end), 7)
    assert prune_retired(ckpt) == 0  # no offset log yet: nothing known to be retired
    (tmp_path / "offsets").mkdir()

    def entry(batch_id: int, end: int) -> None:
        offsets = json.dumps(SourceOffset({("t", 0): end}).to_json())
        meta = json.dumps({"batchWatermarkMs": 0, "batchTimestampMs": 1})
        (tmp_path / "offsets" / str(batch_id)).write_text(f"v1\n{meta}\n{offsets}")

    # Nothing purged yet: the dead-letter query may still follow every batch.
    entry(0, 20)
    entry(1, 40)
    assert prune_retired(ckpt) == 0
    # Spark has purged batches 0-2: the oldest entry left, batch 3, ends at 20.
    for name in ("0", "1"):
        (tmp_path / "offsets" / name).unlink()
    entry(3, 20)
    entry(4, 40)
    # Ranges ending by the oldest entry's end are of batches up to it: deleted.
    assert prune_retired(ckpt) == 2
    assert _files(tmp_path) == ["t/0-20-30-7", "t/0-30-40-7"]
