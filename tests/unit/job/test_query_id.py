"""The query id a local checkpoint holds is read and written from Python (before Spark starts), in
Spark's own metadata format; other schemes still need Spark's Hadoop file system."""

from __future__ import annotations

import json
import uuid
from pathlib import Path

import pytest

from ipcount.errors import ConfigError
from ipcount.job.query_id import checkpoint_query_id


def test_a_new_local_checkpoint_gets_an_id_in_sparks_format(tmp_path: Path) -> None:
    location = tmp_path / "ckpt"
    query_id = checkpoint_query_id(None, str(location))
    # What Spark writes and reads: one JSON line {"id": "<uuid>"}.
    assert json.loads((location / "metadata").read_text()) == {"id": query_id}
    uuid.UUID(query_id)
    assert checkpoint_query_id(None, str(location)) == query_id
    assert checkpoint_query_id(None, f"file://{location}") == query_id


def test_an_id_spark_wrote_is_kept(tmp_path: Path) -> None:
    (tmp_path / "metadata").write_text('{"id":"6a1c8a4e-4d5f-4a43-9a4c-1b0b7c1f9e11"}\n')
    assert checkpoint_query_id(None, str(tmp_path)) == "6a1c8a4e-4d5f-4a43-9a4c-1b0b7c1f9e11"


def test_a_foreign_metadata_file_is_refused(tmp_path: Path) -> None:
    (tmp_path / "metadata").write_text("not json\n")
    with pytest.raises(ConfigError, match="not a Spark checkpoint metadata file"):
        checkpoint_query_id(None, str(tmp_path))


def test_a_remote_checkpoint_needs_a_spark_session() -> None:
    with pytest.raises(ConfigError, match="needs a classic Spark session"):
        checkpoint_query_id(None, "hdfs://namenode:8020/ipcount/ckpt")
