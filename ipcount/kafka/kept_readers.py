"""Readers of one topic kept for repeated short reads in one process: a Python worker's sink tasks
read the progress topic each time they take over a partition's producer from another worker (about
every other batch), and a new consumer per read is a new connection (in production a TLS handshake
and a SASL login) and a metadata request each time."""

from __future__ import annotations

import logging
import threading
from collections import OrderedDict
from collections.abc import Iterator, Mapping
from contextlib import contextmanager

from confluent_kafka import Consumer, KafkaException

from ipcount.errors import BrokerError
from ipcount.kafka import SHORT_FETCH_WAIT_MS
from ipcount.kafka.topic_reader import TopicReader, consumer_conf

__all__ = ["KeptReaders", "kept_readers"]

logger = logging.getLogger(__name__)

# Processes that read several topics or clusters (tests, the bench) keep the readers of the last
# few only; the others are closed.
_MAX_KEPT = 2


class KeptReaders:
    """One TopicReader per isolation level for one topic, re-positioned for each read, and one
    read_uncommitted consumer that looks up their offsets and fetches nothing. One read at a time
    (a lock); a reader a read failed in is closed, and the next read opens a new one."""

    def __init__(self, conf: Mapping[str, str], topic: str, topic_setting: str) -> None:
        # It gives up its partitions after each read, but not a fetch left waiting at the end.
        self._conf = {**conf, "fetch.wait.max.ms": SHORT_FETCH_WAIT_MS}
        self.topic, self._setting = topic, topic_setting
        self._readers: dict[str, TopicReader] = {}
        self._lookups: Consumer | None = None
        self._lock = threading.RLock()

    @contextmanager
    def reading(
        self, isolation: str, start_at: Mapping[int, int] | None = None
    ) -> Iterator[TopicReader]:
        """A reader positioned as `TopicReader(..., start_at=start_at)` would be; it gives up its
        partitions when the block ends."""
        with self._lock:
            reader = self._readers.pop(isolation, None)
            if reader is not None:
                try:
                    reader.restart(start_at)
                except (KafkaException, BrokerError) as exc:
                    # A new reader says what is wrong (a missing topic, an unreachable broker).
                    logger.debug("kept reader of %s failed (%s): opening another", self.topic, exc)
                    reader.close()
                    reader = None
            if reader is None:
                reader = TopicReader(
                    self._conf, self.topic, isolation=isolation, topic_setting=self._setting,
                    start_at=start_at, lookups=self._lookup_consumer(),
                )  # fmt: skip
            try:
                yield reader
                reader.release()
            except BaseException:
                reader.close()
                raise
            self._readers[isolation] = reader

    def _lookup_consumer(self) -> Consumer:
        if self._lookups is None:
            self._lookups = Consumer(consumer_conf(self._conf, "read_uncommitted", "ipcount-probe"))
        return self._lookups

    def close(self) -> None:
        """Close every consumer (a later read opens new ones)."""
        with self._lock:
            for reader in self._readers.values():
                reader.close()
            self._readers = {}
            lookups, self._lookups = self._lookups, None
            if lookups is not None:
                lookups.close()


_KEPT: OrderedDict[tuple[str, tuple[tuple[str, str], ...]], KeptReaders] = OrderedDict()
_KEPT_LOCK = threading.Lock()


def kept_readers(conf: Mapping[str, str], topic: str, topic_setting: str) -> KeptReaders:
    """This process's kept readers of `topic` with these consumer settings."""
    key = (topic, tuple(sorted((k, str(v)) for k, v in conf.items())))
    with _KEPT_LOCK:
        kept = _KEPT.get(key)
        if kept is None:
            kept = _KEPT[key] = KeptReaders(conf, topic, topic_setting)
        _KEPT.move_to_end(key)
        while len(_KEPT) > _MAX_KEPT:
            _, oldest = _KEPT.popitem(last=False)
            oldest.close()
        return kept
