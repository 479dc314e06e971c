"""A query's offset and commit logs, read from Python (driver): the watermark a micro-batch judges
late records by, each batch's source end offsets, and which batches Spark counts as done."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

from ipcount.errors import ConfigError, SourceError

__all__ = ["BatchWatermarks", "OffsetLog", "absolute_location", "check_readable", "local_path"]


@dataclass(frozen=True)
class BatchWatermarks:
    """Batch `batch_id` of the query: its own watermark and the one late records are judged by."""

    batch_id: int
    watermark_ms: int
    late_before_ms: int
    # Spark's batchTimestampMs: what current_timestamp() is in this batch (0: not recorded).
    batch_timestamp_ms: int = 0


class OffsetLog:
    """Read-only view of `<checkpoint>/offsets` (and `commits`).

    Local paths and file:// URIs are read directly; other schemes (s3://, s3a://, gs://, hdfs://)
    through pyarrow's filesystems, when pyarrow supports them on this machine.
    """

    def __init__(self, checkpoint: str) -> None:
        self.checkpoint = checkpoint.rstrip("/")
        self._fs, self._root = _filesystem(self.checkpoint)

    def query_id(self) -> str | None:
        """The query id in the checkpoint's `metadata` file, None before the query's first start.

        Raises:
            SourceError: the file is not Spark's checkpoint metadata.
        """
        try:
            text = self._read(f"{self._root}/metadata")
        except FileNotFoundError:
            return None
        try:
            return str(json.loads(text.splitlines()[0])["id"])
        except (ValueError, KeyError, IndexError, TypeError) as exc:
            raise SourceError(f"{self.checkpoint}/metadata is unreadable: {exc!r}") from exc

    def batch_ids(self) -> list[int]:
        """The batch ids that have an offset log entry, ascending."""
        return sorted(int(name) for name in self._list(f"{self._root}/offsets") if name.isdigit())

    def entry(self, batch_id: int) -> tuple[dict[str, Any], list[Any]]:
        """(metadata, source offsets) of one entry.

        Raises:
            SourceError: the entry is missing or not in Spark's offset log format.
        """
        path = f"{self._root}/offsets/{batch_id}"
        try:
            lines = self._read(path).splitlines()
        except FileNotFoundError:
            raise SourceError(f"offset log entry {self.checkpoint}/offsets/{batch_id} is missing")
        if len(lines) < 2 or not lines[0].startswith("v"):
            raise SourceError(f"{self.checkpoint}/offsets/{batch_id} is not a Spark offset log")
        try:
            meta = json.loads(lines[1])
            offsets = [None if line == "-" else json.loads(line) for line in lines[2:]]
        except json.JSONDecodeError as exc:
            raise SourceError(f"{self.checkpoint}/offsets/{batch_id} is unreadable: {exc}") from exc
        return meta, offsets

    def source_end(self, batch_id: int) -> Any:
        """The (single) source's end offset of a batch, None when the entry is missing."""
        if batch_id not in self.batch_ids():
            return None
        offsets = self.entry(batch_id)[1]
        return offsets[0] if len(offsets) == 1 else offsets

    def committed_ids(self) -> list[int]:
        """The batch ids Spark's commit log marks as done, ascending."""
        return sorted(int(name) for name in self._list(f"{self._root}/commits") if name.isdigit())

    def last_committed(self) -> int | None:
        """The newest batch id Spark's commit log marks as done, None before the first."""
        ids = self.committed_ids()
        return ids[-1] if ids else None

    def committed_watermark_ms(self) -> int | None:
        """The watermark Spark carries into the batch after its newest committed one
        (`nextBatchWatermarkMs` of the commit log: the newest event time it has seen, less the
        delay), or None when no batch was committed or the entry does not say."""
        last = self.last_committed()
        if last is None:
            return None
        lines = self._read(f"{self._root}/commits/{last}").splitlines()
        try:
            meta = json.loads(lines[1]) if len(lines) > 1 else {}
        except json.JSONDecodeError as exc:
            raise SourceError(f"{self.checkpoint}/commits/{last} is unreadable: {exc}") from exc
        value = meta.get("nextBatchWatermarkMs")
        return int(value) if value is not None else None

    def watermarks_for(self, end: dict[str, Any]) -> BatchWatermarks:
        """The watermarks of the newest batch whose source end offset is `end` (the batch being
        planned; an idle batch repeats its predecessor's offsets, so the newest one is taken).

        Spark's streaming aggregation drops a row as late when its window ends at or before the
        *previous* batch's watermark (`eventTimeWatermarkForLateEvents`: measured on Spark 4.x,
        the window's end is compared, not the event time). Both batch watermarks are in the
        checkpoint before a batch runs: `<checkpoint>/offsets/<N>` holds, on its second line,
        {"batchWatermarkMs": ...} of batch N, and on the lines after it each source's end offset.
        So late_before is batch N-1's watermark, and a replayed batch (same offset log entries)
        classifies every record the same way.

        Raises:
            SourceError: no batch in the log ends at `end` (the checkpoint is another query's).
        """
        for batch_id in reversed(self.batch_ids()):
            meta, offsets = self.entry(batch_id)
            if end not in offsets:
                continue
            late_before = 0
            if batch_id > 0:
                previous, _ = self.entry(batch_id - 1)
                late_before = int(previous.get("batchWatermarkMs", 0))
            return BatchWatermarks(
                batch_id,
                int(meta.get("batchWatermarkMs", 0)),
                late_before,
                int(meta.get("batchTimestampMs", 0)),
            )
        raise SourceError(
            f"no micro-batch in {self.checkpoint}/offsets ends at {json.dumps(end)}: option "
            "queryCheckpoint must be this query's own checkpointLocation"
        )

    def _list(self, path: str) -> list[str]:
        if self._fs is None:
            p = Path(path)
            return [c.name for c in p.iterdir()] if p.is_dir() else []
        import pyarrow.fs as pafs

        infos = self._fs.get_file_info(pafs.FileSelector(path, allow_not_found=True))
        return [info.base_name for info in infos]

    def _read(self, path: str) -> str:
        if self._fs is None:
            return Path(path).read_text(encoding="utf-8")
        try:
            with self._fs.open_input_stream(path) as fh:
                return bytes(fh.read()).decode("utf-8")
        except OSError as exc:
            if "not found" in str(exc).lower() or "no such file" in str(exc).lower():
                raise FileNotFoundError(path) from exc
            raise


def absolute_location(location: str) -> str:
    """A local checkpoint path made absolute, as other processes (Python workers started in any
    working directory) must see it; URIs unchanged."""
    import os

    return location if "://" in location else os.path.abspath(location)


def local_path(location: str) -> str | None:
    """The local file-system path of a checkpoint location, None for other schemes."""
    parsed = urlparse(location)
    if parsed.scheme == "file":
        return parsed.path
    if parsed.scheme == "" or (len(parsed.scheme) == 1 and location[1:3] == ":\\"):
        return location
    return None


def _filesystem(location: str) -> tuple[Any, str]:
    """(pyarrow filesystem or None for local, path inside it)."""
    local = local_path(location)
    if local is not None:
        return None, local
    parsed = urlparse(location)
    uri = "s3" + location[3:] if parsed.scheme == "s3a" else location
    try:
        import pyarrow.fs as pafs

        return pafs.FileSystem.from_uri(uri)  # type: ignore[no-any-return]
    except (ImportError, OSError, ValueError) as exc:
        raise ConfigError(
            f"late corrections need to read the checkpoint's offset log, and {location!r} cannot "
            f"be read from Python here ({exc}). Put job.checkpoint_location on a local or shared "
            "file system, or on storage pyarrow reads (s3://, gs://, hdfs:// with libhdfs), or "
            "set job.late_corrections = false (late records are then dropped, counted as "
            "dropped=)"
        ) from exc


def check_readable(checkpoint: str) -> None:
    """Fail at start-up, not in the first batch, when the checkpoint cannot be read from Python.

    Raises:
        ConfigError: as `_filesystem`.
    """
    _filesystem(checkpoint.rstrip("/"))
