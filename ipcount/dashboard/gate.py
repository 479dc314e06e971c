"""Which final results a live view may show yet: sink tasks commit their shares of a micro-batch
one by one, so a window is shown only once the query's progress marker vouches that every share
of the batch that closed it is in. CLI side."""

from __future__ import annotations

import logging

from ipcount.config import Settings
from ipcount.errors import ConfigError, IpcountError
from ipcount.kafka.records import SinkRecord
from ipcount.kafka.topic_reader import TopicReader
from ipcount.sink.runs import ProgressView

__all__ = ["WindowGate"]

logger = logging.getLogger(__name__)


class WindowGate:
    """The progress topic, followed (read_committed) beside the sink.

    A query's marker of batch N is committed after every sink task committed its share of N,
    and every window that batch closed ends at or before the marker's watermark. So a window
    ending at or before the newest such watermark read *before* a cut was taken is whole below
    that cut. `limit()` is that watermark. There is no limit (None) when the progress topic does
    not exist (a sink of another writer), or when its markers of the sink are all the query's
    own (a driver-side transaction per batch, as ipcount wrote before per-task commits): each
    transaction then holds whole windows. A sink with no marker yet is held back until one comes.
    """

    def __init__(self, settings: Settings) -> None:
        self.sink = settings.topics.sink
        self.view = ProgressView()
        self.reader: TopicReader | None = None
        try:
            self.reader = TopicReader(
                settings.kafka.to_librdkafka("consumer"),
                settings.topics.progress,
                timeout=settings.kafka.connect_timeout_seconds,
                topic_setting="topics.progress",
            )
        except ConfigError as exc:
            logger.info("%s: windows are shown as their results arrive", exc)
            return
        # What is there already, before the first cut (the rest comes with `poll`).
        try:
            for rec in self.reader.read_to_end(settings.kafka.connect_timeout_seconds):
                self._take(rec)
        except IpcountError as exc:
            logger.info("progress markers read in part: %s", exc)

    def poll(self, timeout: float) -> None:
        """Take the markers that arrived (no wait beyond `timeout`)."""
        if self.reader is None:
            return
        for rec in self.reader.poll(timeout=timeout):
            self._take(rec)

    def _take(self, rec: SinkRecord) -> None:
        try:
            self.view.add(rec.key, rec.value, (rec.partition, rec.offset, rec.where))
        except IpcountError as exc:
            logger.debug("not a progress marker of ipcount's: %s", exc)

    def limit(self) -> int | None:
        """The newest watermark (epoch ms) of the sink's query markers read so far: windows
        ending after it may be partly committed (-1 when none is read yet); None: no limit."""
        if self.reader is None:
            return None
        if not any(m.topic == self.sink for m in self.view.partitions.values()) and any(
            m.topic == self.sink for m in self.view.markers.values()
        ):
            return None
        marks = [
            m.watermark_ms
            for m in self.view.markers.values()
            if m.topic == self.sink and m.watermark_ms is not None
        ]
        return max(marks, default=-1)

    def close(self) -> None:
        if self.reader is not None:
            self.reader.close()
            self.reader = None
