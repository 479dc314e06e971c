"""What one sink session reads of the progress topic: a sink task's reads continue its last one
(its view) and stop after its own keys, with the consumers its Python worker keeps; the driver's
session reads the whole topic with new ones (it reads it rarely)."""

from __future__ import annotations

from ipcount.kafka.kept_readers import KeptReaders, kept_readers
from ipcount.kafka.quirks import broker_quirks
from ipcount.sink.fencing import superseded_by
from ipcount.sink.marker import marker_key
from ipcount.sink.producer_config import TxnConfig
from ipcount.sink.runs import ProgressView, read_progress

__all__ = ["ProgressReads"]


class ProgressReads:
    """A session's reads of the progress topic (read_committed), and the view they build."""

    def __init__(self, config: TxnConfig) -> None:
        self.config = config
        # A sink task's view of the topic, kept when a fence discards the rest of its session: the
        # next read (re-initialising after another worker's commit) continues it.
        self._seen: ProgressView | None = None

    def read(self) -> ProgressView:
        """The topic as far as this session's keys' last records (a sink task: another task
        killed inside its transaction must not hold it back; its retry may be waiting for this
        very core), or whole (the driver's)."""
        cfg = self.config
        view = read_progress(
            cfg.consumer_conf, cfg.progress_topic, cfg.retry_deadline_seconds, self._keys(),
            self._continue(), self._readers(),
        )  # fmt: skip
        if cfg.sink_partition is not None:
            self._seen = view
        return view

    def superseded_by(self) -> str | None:
        """The run id of a newer start that has committed the query's newest batch
        (sink.fencing.superseded_by), read continuing this session's view."""
        return superseded_by(self.config, self._continue(), self._readers())

    def _keys(self) -> set[bytes] | None:
        cfg = self.config
        if cfg.sink_partition is None:
            return None
        return {marker_key(cfg.query_id), marker_key(cfg.query_id, cfg.sink_partition)}

    def _continue(self) -> ProgressView | None:
        """The view a sink task's next read continues (None: the driver's session, which reads
        the topic whole; it re-reads it only when fenced, rarely)."""
        return self._seen if self.config.sink_partition is not None else None

    def _readers(self) -> KeptReaders | None:
        """The consumers a sink task reads with, kept by its Python worker for all its sessions
        (None: the driver's session, and noida-db, whose reads start at the log's start each
        time)."""
        cfg = self.config
        if cfg.sink_partition is None:
            return None
        if broker_quirks(cfg.consumer_conf).hides_commits_read_mid_log:
            return None
        return kept_readers(cfg.consumer_conf, cfg.progress_topic, "topics.progress")
