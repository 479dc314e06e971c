"""The dead-letter query through a catch-up under a read limit: it runs every
job.dead_letter_interval_seconds while the counting query runs a batch of at most
job.max_offsets_per_trigger records every few seconds, so one dead-letter batch must follow every
counting batch planned since its last (up to MAX_FOLLOWED_BATCHES), not one limit's worth."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

from ipcount.config import Settings
from ipcount.formats.accesslog import format_record
from ipcount.source.follow import MAX_FOLLOWED_BATCHES
from ipcount.source.offsets import SourceOffset
from ipcount.source.options import parse_options, source_options
from ipcount.source.reader import KafkaStreamReader

T0 = 1_767_225_600_000  # a window boundary
LIMIT = 100


def _counting_batches(checkpoint: Path, topic: str, ends: list[int]) -> None:
    """The counting query's offset log: batch i read up to ends[i] of `topic`/0."""
    offsets = checkpoint / "offsets"
    offsets.mkdir(parents=True)
    for batch_id, end in enumerate(ends):
        entry = SourceOffset({(topic, 0): end}).to_json()
        meta = {"batchTimestampMs": T0 + 60_000 + batch_id * 1_000}
        (offsets / str(batch_id)).write_text(f"v1\n{json.dumps(meta)}\n{json.dumps(entry)}")


def _dead_letter_end(settings: Settings, tmp: Path, topic: str) -> int:
    opts = source_options(
        settings,
        output="rejects",
        heartbeats=False,
        query_checkpoint=str(tmp / "dead-letter"),
        counts_checkpoint=str(tmp / "counts"),
    )
    reader = KafkaStreamReader(parse_options(opts))
    start = SourceOffset({(topic, 0): 0}).to_json()
    end = reader.latestOffset(start, reader.getDefaultReadLimit())
    return SourceOffset.from_json(end).offsets[(topic, 0)]


def test_a_dead_letter_batch_follows_every_counting_batch_of_a_catch_up_whatever_the_limit(
    make_settings: Callable[..., Settings],
    topic_with: Callable[[list[bytes]], str],
    tmp_path: Path,
) -> None:
    """Ten counting batches of LIMIT records each are done when the dead-letter query next runs:
    it takes all ten at once (before: one, so a backlog's dead letters fell a batch further behind
    every dead-letter interval), and no more than MAX_FOLLOWED_BATCHES of a longer run."""
    total = 30 * LIMIT
    values = [format_record(f"10.0.0.{i % 7}", T0 + i * 10).encode() for i in range(total)]
    values[5::97] = [b"not an access line"] * len(values[5::97])
    topic = topic_with(values)
    settings = make_settings(f"topics.source={topic}", f"job.max_offsets_per_trigger={LIMIT}")

    _counting_batches(tmp_path / "counts", topic, [LIMIT * (i + 1) for i in range(10)])
    assert _dead_letter_end(settings, tmp_path, topic) == 10 * LIMIT

    # A longer run of small batches: one dead-letter batch follows at most MAX_FOLLOWED_BATCHES.
    longer = tmp_path / "longer"
    _counting_batches(longer / "counts", topic, [LIMIT * (i + 1) for i in range(30)])
    assert _dead_letter_end(settings, longer, topic) == MAX_FOLLOWED_BATCHES * LIMIT
