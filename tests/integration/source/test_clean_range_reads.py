"""Clean-range markers through the real read tasks (issue 31): a counting task that finds no
rejects in its range leaves a marker, and the dead-letter task for exactly that range then reads
nothing; any other range (rejects, another split, another batch time) is read and judged."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from ipcount.formats.accesslog import format_record
from ipcount.source import counting_task
from ipcount.source.offsets import OffsetRange, SourceOffset
from ipcount.source.options import SourceOptions, parse_options
from ipcount.source.reader import KafkaInputPartition, KafkaStreamReader

T0 = 1_767_225_600_000  # a window boundary
SKEW = 300_000
N = 400


class _Fetched:
    """Counts the records the read tasks fetch from Kafka (the real reads underneath: chunks the
    counting converts, messages the dead letters judge)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.records = 0
        self.reads = 0
        for name in ("read_values", "read_messages"):
            monkeypatch.setattr(counting_task, name, self._counted(getattr(counting_task, name)))

    def _counted(self, real: Callable[..., Iterator[Any]]) -> Callable[..., Iterator[Any]]:
        def counting(
            options: SourceOptions, rng: OffsetRange, *args: Any, **kwargs: Any
        ) -> Iterator[Any]:
            self.reads += 1
            for chunk in real(options, rng, *args, **kwargs):
                self.records += len(chunk)
                yield chunk

        return counting


def _reader(bootstrap: str, topic: str, output: str, tmp: Path) -> KafkaStreamReader:
    counts_ckpt = str(tmp / "counts")
    options = {
        "subscribe": topic,
        "kafka.bootstrap.servers": bootstrap,
        "eventTimeFormat": "nginx-combined",
        "output": output,
        "maxFutureSkewMs": str(SKEW),
    }
    if output == "counts":
        options.update(queryCheckpoint=counts_ckpt, cleanRangeMarkers="true")
    else:
        options.update(queryCheckpoint=str(tmp / "dead-letter"), countsCheckpoint=counts_ckpt)
    return KafkaStreamReader(parse_options(options))


def _read(reader: KafkaStreamReader, rng: OffsetRange, batch_ms: int) -> list[dict]:
    batches = list(reader.read(KafkaInputPartition(rng, None, T0, batch_ms)))
    return pa.Table.from_batches(batches).to_pylist() if batches else []


def _markers(tmp: Path) -> list[Path]:
    root = tmp / "counts" / "clean-ranges"
    return sorted(p for p in root.rglob("*") if p.is_file()) if root.exists() else []


def test_a_clean_range_is_not_fetched_again_by_the_dead_letter_task(
    bootstrap: str,
    topic_with: Callable[[list[bytes]], str],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    good = [format_record(f"10.0.0.{i % 5}", T0 + i * 10).encode() for i in range(N)]
    topic = topic_with(good)
    fetched = _Fetched(monkeypatch)
    whole = OffsetRange(topic, 0, 0, N)
    batch_ms = T0 + 60_000

    counting = _reader(bootstrap, topic, "counts", tmp_path)
    counts = _read(counting, whole, batch_ms)
    assert sum(r["count"] for r in counts if r["kind"] == "counted") == N
    assert fetched.records == N
    assert len(_markers(tmp_path)) == 1
    # The counting query's batch ends (Spark keeps its offset log entry): the marker stays.
    (tmp_path / "counts" / "offsets").mkdir()
    end = json.dumps(SourceOffset({(topic, 0): N}).to_json())
    (tmp_path / "counts" / "offsets" / "0").write_text(
        f'v1\n{{"batchTimestampMs": {batch_ms}}}\n{end}'
    )
    counting.commit(SourceOffset({(topic, 0): N}).to_json())
    assert len(_markers(tmp_path)) == 1

    rejects = _reader(bootstrap, topic, "rejects", tmp_path)
    # Another split, or another batch time, never uses the marker: read and judged as before.
    assert _read(rejects, OffsetRange(topic, 0, 0, N // 2), batch_ms) == []
    assert fetched.records == N + N // 2
    assert _read(rejects, whole, batch_ms + 1) == []
    assert fetched.records == 2 * N + N // 2
    assert len(_markers(tmp_path)) == 1

    # Exactly the counted range, judged by the same batch time: nothing fetched, marker used up.
    reads = fetched.reads
    assert _read(rejects, whole, batch_ms) == []
    assert (fetched.records, fetched.reads) == (2 * N + N // 2, reads)
    assert _markers(tmp_path) == []

    # The marker is gone: a replay of that task reads the range again (and still finds nothing).
    assert _read(rejects, whole, batch_ms) == []
    assert fetched.records == 3 * N + N // 2


def test_a_range_with_rejects_leaves_no_marker_and_its_dead_letters_are_produced(
    bootstrap: str,
    topic_with: Callable[[list[bytes]], str],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    batch_ms = T0 + 60_000
    good = [format_record(f"10.0.0.{i % 5}", T0 + i * 10).encode() for i in range(N)]
    future = format_record("10.0.0.9", batch_ms + SKEW + 1_000).encode()
    values = good[:100] + [b"junk"] + good[100:] + [future]
    topic = topic_with(values)
    fetched = _Fetched(monkeypatch)
    whole = OffsetRange(topic, 0, 0, len(values))

    counts = _read(_reader(bootstrap, topic, "counts", tmp_path), whole, batch_ms)
    assert {r["kind"]: r["count"] for r in counts if r["kind"] != "counted"} == {
        "malformed": 1,
        "future": 1,
    }
    assert _markers(tmp_path) == []

    rejects = _read(_reader(bootstrap, topic, "rejects", tmp_path), whole, batch_ms)
    assert [(r["offset"], r["reason"]) for r in rejects] == [
        (100, "malformed: not a valid nginx combined-format line"),
        (N + 1, "future: event time more than 300 s ahead of its batch time"),
    ]
    assert fetched.records == 2 * len(values)


def test_no_markers_without_the_option_or_on_a_remote_checkpoint(
    bootstrap: str, topic_with: Callable[[list[bytes]], str], tmp_path: Path
) -> None:
    good = [format_record("10.0.0.1", T0 + i).encode() for i in range(10)]
    topic = topic_with(good)
    base = {
        "subscribe": topic,
        "kafka.bootstrap.servers": bootstrap,
        "eventTimeFormat": "nginx-combined",
        "output": "counts",
    }
    task = KafkaInputPartition(OffsetRange(topic, 0, 0, 10), None, T0, T0 + 60_000)
    off = {**base, "queryCheckpoint": str(tmp_path / "counts")}
    assert list(KafkaStreamReader(parse_options(off)).read(task))
    remote = {**base, "queryCheckpoint": "s3a://bucket/ckpt", "cleanRangeMarkers": "true"}
    assert list(KafkaStreamReader(parse_options(remote)).read(task))
    assert _markers(tmp_path) == []


def test_the_dead_letter_planner_leaves_out_tasks_for_clean_ranges(
    bootstrap: str,
    topic_with: Callable[[list[bytes]], str],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The driver already sees the markers: a dead-letter batch whose every range is clean plans
    no task at all (no Python worker is started to find nothing); other batch times still read."""
    topic = topic_with([format_record("10.0.0.1", T0 + i * 10).encode() for i in range(N)])
    batch_ms = T0 + 60_000
    whole = OffsetRange(topic, 0, 0, N)
    _read(_reader(bootstrap, topic, "counts", tmp_path), whole, batch_ms)
    assert len(_markers(tmp_path)) == 1
    rejects = _reader(bootstrap, topic, "rejects", tmp_path)
    start = SourceOffset({(topic, 0): 0}).to_json()
    for entry, judged in enumerate((batch_ms, batch_ms + 1)):
        end = SourceOffset({(topic, 0): N}, None, {(topic, 0): ((N, judged),)}).to_json()
        offsets = tmp_path / "dead-letter" / "offsets"
        offsets.mkdir(parents=True, exist_ok=True)
        (offsets / str(entry)).write_text(f'v1\n{{"batchTimestampMs": 1}}\n{json.dumps(end)}')
        tasks = rejects.partitions(start, end)
        if judged == batch_ms:
            assert tasks == []
        else:  # judged by another batch time: the marker does not apply
            assert [(t.range, t.batch_ms) for t in tasks] == [(whole, judged)]
