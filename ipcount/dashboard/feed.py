"""Reads the sink's final results and the late corrections with read_committed into a WindowBook,
reporting when it has caught up (every committed transaction read in full). CLI side."""

from __future__ import annotations

import logging
from collections.abc import Iterable

from ipcount.config import Settings
from ipcount.dashboard.model import WindowBook
from ipcount.formats.avro import Codec, IpCount, make_codec
from ipcount.kafka.consume import SinkRecord, TopicReader, decode_records

__all__ = ["ResultFeed"]

logger = logging.getLogger(__name__)

# One look at each topic per step: short, so two topics are read in turn without waiting long.
_POLL_SECONDS = 0.2


class ResultFeed:
    """topics.sink (kind 'final') and, `with_late`, topics.late (kind 'late'), read from the
    beginning with isolation.level=read_committed. Use as a context manager.

    A window's results are written in one transaction, spread over partitions; the feed only says
    it has caught up when every partition of both topics is read to its last stable offset, so a
    caller that looks at the book then never sees half a window.
    """

    def __init__(self, settings: Settings, *, with_late: bool = True) -> None:
        self.settings = settings
        self.with_late = with_late
        self.records = 0
        self._readers: list[tuple[TopicReader, str, Codec]] = []

    def __enter__(self) -> ResultFeed:
        self.open()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def open(self) -> None:
        """Connect and assign every partition at its start.

        Raises:
            BrokerError: the broker is unreachable.
            ConfigError: a topic does not exist (naming the setting), or a bad wire format.
        """
        s = self.settings
        conf = s.kafka.to_librdkafka("consumer")
        timeout = s.kafka.connect_timeout_seconds
        topics = [(s.topics.sink, "final", "topics.sink")]
        if self.with_late:
            topics.append((s.topics.late, "late", "topics.late"))
        try:
            for topic, kind, setting in topics:
                codec = make_codec(s.sink.wire_format, s.sink.schema_registry_url, topic)
                reader = TopicReader(
                    conf, topic, from_beginning=True, timeout=timeout, topic_setting=setting
                )
                self._readers.append((reader, kind, codec))
        except BaseException:
            self.close()
            raise

    def close(self) -> None:
        for reader, _, _ in self._readers:
            reader.close()
        self._readers = []

    def _apply(
        self, book: WindowBook, records: Iterable[SinkRecord], kind: str, codec: Codec
    ) -> int:
        n = 0
        for _, result in decode_records(records, codec):
            self._add(book, result, kind)
            n += 1
        self.records += n
        return n

    @staticmethod
    def _add(book: WindowBook, result: IpCount, kind: str) -> None:
        if not book.add(result, kind):
            logger.debug("not shown (window older than the kept ones): %s %s", kind, result)

    def read_to_end(self, book: WindowBook, deadline_seconds: float = 60.0) -> None:
        """Read both topics to their ends as they are now into `book`.

        Raises:
            IpcountError: an open transaction kept a topic from its end (see TopicReader).
            DecodeError: a record is not an IpCount.
        """
        for reader, kind, codec in self._readers:
            self._apply(book, reader.read_to_end(deadline_seconds), kind, codec)

    def step(self, book: WindowBook) -> bool:
        """One look at each topic, applying what arrived to `book`. Returns True when caught up:
        nothing arrived and every partition of both topics is read to its end.

        Raises:
            BrokerError: the end offsets could not be queried (the broker is unreachable).
        """
        got = 0
        for reader, kind, codec in self._readers:
            got += self._apply(book, reader.poll(timeout=_POLL_SECONDS), kind, codec)
        if got:
            return False
        return all(reader.caught_up() for reader, _, _ in self._readers)
