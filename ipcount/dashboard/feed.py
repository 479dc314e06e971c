"""Reads the sink's final results and the late corrections with read_committed into a WindowBook,
reporting when it has caught up (every committed transaction read in full). CLI side."""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable

from ipcount.config import Settings
from ipcount.dashboard.model import WindowBook
from ipcount.errors import IpcountError
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

    def catch_up(self, book: WindowBook, stall_seconds: float = 30.0) -> None:
        """Read both topics into `book` until caught up (as `step` says it): every transaction
        committed by then is in the book in full, none in part. No overall deadline: a long topic
        takes as long as it takes while records keep coming; an open transaction does not hold
        it back (read_committed stops before it, and so does this).

        Raises:
            IpcountError: no record arrived and no position moved for `stall_seconds` while
                records remained to read.
            BrokerError: the end offsets could not be queried (the broker is unreachable).
            DecodeError: a record is not an IpCount.
        """
        mark, since = self._progress(), time.monotonic()
        at_end: set[int] = set()  # readers found at their end since the last look at all
        while True:
            if len(at_end) == len(self._readers):
                # One look at every topic with nothing arriving and all at their ends: only then
                # is no transaction read in part (a commit since a reader's own look is seen).
                if self.step(book):
                    return
                at_end.clear()
            for i, (reader, kind, codec) in enumerate(self._readers):
                if i in at_end:
                    continue  # not polled again: an idle reader's back-off would slow the rest
                if not self._apply(book, reader.poll(timeout=_POLL_SECONDS), kind, codec):
                    if reader.caught_up():
                        at_end.add(i)
            now = self._progress()
            if now != mark:
                mark, since = now, time.monotonic()
            elif time.monotonic() - since > stall_seconds:
                behind = ", ".join(
                    r.topic for i, (r, _, _) in enumerate(self._readers) if i not in at_end
                )
                raise IpcountError(
                    f"reading {behind or 'the result topics'} made no progress for "
                    f"{stall_seconds:g}s with records left to read: is the broker overloaded or "
                    "going away? (kafka.bootstrap_servers)"
                )

    def _progress(self) -> tuple[int, int]:
        """Records read and the sum of all positions (which also move past aborted records
        and transaction markers)."""
        return self.records, sum(sum(r.positions().values()) for r, _, _ in self._readers)

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
