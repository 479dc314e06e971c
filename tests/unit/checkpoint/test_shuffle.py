"""The shuffle partitions a checkpoint fixed: Spark keeps them for good, so a different setting
is refused with what to do (the sink tasks and the state are partitioned by them)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ipcount.checkpoint.shuffle import check_shuffle_partitions, checkpoint_shuffle_partitions
from ipcount.errors import ConfigError


def _entry(ckpt: Path, batch: int, partitions: str) -> None:
    (ckpt / "offsets").mkdir(parents=True, exist_ok=True)
    meta = {"batchWatermarkMs": 0, "conf": {"spark.sql.shuffle.partitions": partitions}}
    (ckpt / "offsets" / str(batch)).write_text(f"v1\n{json.dumps(meta)}\n{{}}")


def test_a_new_checkpoint_takes_the_setting(tmp_path: Path) -> None:
    assert checkpoint_shuffle_partitions(str(tmp_path / "none")) is None
    assert check_shuffle_partitions(str(tmp_path / "none"), 8) == 8


def test_the_setting_must_match_what_the_checkpoint_fixed(tmp_path: Path) -> None:
    _entry(tmp_path, 0, "4")
    _entry(tmp_path, 1, "2")
    assert checkpoint_shuffle_partitions(str(tmp_path)) == 2
    assert check_shuffle_partitions(str(tmp_path), 2) == 2
    with pytest.raises(ConfigError, match=r"spark.shuffle_partitions is 4.*started with 2.*= 2"):
        check_shuffle_partitions(str(tmp_path), 4)
