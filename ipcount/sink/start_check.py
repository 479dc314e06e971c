"""The job's start check of its checkpoint against the sink's committed history (driver): refuse
a lost commit, an older checkpoint, or a new query on another query's output; or, with
`--new-query`, start where that output ends. The rules are in sink.history."""

from __future__ import annotations

import logging

from ipcount.checkpoint.offset_log import absolute_location
from ipcount.config import RunMode, Settings
from ipcount.errors import ConfigError
from ipcount.sink.history import (
    adopt,
    check_checkpoint,
    other_query_output,
    refuse_new_query,
    starting_offsets_after,
)
from ipcount.sink.producer_config import new_run_id
from ipcount.sink.runs import announce_run, read_progress

__all__ = ["check_sink_history"]

logger = logging.getLogger(__name__)


def check_sink_history(
    settings: Settings, query_id: str, checkpoint: str, topic: str, mode: RunMode
) -> tuple[Settings, str]:
    """Compare the checkpoint with the sink's committed history before the query starts, then
    announce this start (a new run id) as the query's newest; returns the settings to start with
    (for `mode.new_query`, starting at the other query's last offsets) and the run id.

    Raises:
        SinkHistoryError: a lost commit, an older checkpoint, or another query's output.
        ConfigError: `mode.new_query` on a checkpoint that already has output.
    """
    # One read of the progress topic: the markers and this query's earlier starts.
    seen = read_progress(
        settings.kafka.to_librdkafka("consumer"),
        settings.topics.progress,
        settings.sink.retry_deadline_seconds,
    )
    markers = seen.markers
    own = markers.get(query_id)
    check_checkpoint(own, absolute_location(checkpoint), topic)
    other = other_query_output(markers, query_id, topic, [settings.topics.source])
    if own is not None and mode.new_query:
        raise ConfigError(
            f"--new-query: the checkpoint {checkpoint} already wrote batch {own.batch_id} "
            f"to {topic!r}; it is not a new query. Run without --new-query"
        )
    if own is None and other is not None:
        if not mode.new_query:
            raise refuse_new_query(other, query_id, topic, checkpoint)
        start = starting_offsets_after(other)
        logger.warning(
            "--new-query: query %s starts on %s where query %s's output ends: %s",
            query_id,
            topic,
            other.query_id,
            start,
        )
        settings = settings.replace("job", starting_offsets=start)
    run_id = new_run_id()
    producer = settings.kafka.to_librdkafka("producer")
    if own is None and other is not None:
        adopt(producer, settings.topics.progress, query_id, run_id, other)
    announce_run(producer, settings.topics.progress, query_id, run_id, seen=seen)
    return settings, run_id
