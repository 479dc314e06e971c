"""Reads the sink's final results and the late corrections with read_committed into a WindowBook,
cut at transaction boundaries: the book only ever holds whole transactions, and a window only once
every sink task's share of it is in (dashboard.gate). CLI side."""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable

from ipcount.config import Settings
from ipcount.dashboard.gate import WindowGate
from ipcount.dashboard.model import WindowBook
from ipcount.errors import IpcountError
from ipcount.formats.avro import Codec, IpCount, make_codec
from ipcount.kafka.records import SinkRecord, decode_records
from ipcount.kafka.topic_reader import TopicReader

__all__ = ["ResultFeed"]

logger = logging.getLogger(__name__)

# One look at each topic per step: short, so a cut is looked for several times a second.
_POLL_SECONDS = 0.1
# While a partition holds undecided records, its last stable offsets are a cut only once none
# has moved for this long: an open transaction that is not committing (a stopped job's, until
# the broker aborts it), not a commit whose markers have landed on some partitions only.
_STILL_SECONDS = 5.0

# A cut: for each (reader index, partition), the offset the book holds every record below.
Cut = dict[tuple[int, int], int]


class ResultFeed:
    """topics.sink (kind 'final') and, `with_late`, topics.late (kind 'late'), read from the
    beginning with isolation.level=read_committed. Use as a context manager.

    The job writes a batch's results and corrections in one transaction per sink task, over several
    partitions of both topics, and a read_committed reader may receive them over several polls. The
    feed applies records to the book only up to a cut: per partition, a last stable offset (below it
    every transaction is decided, and read_committed shows each whole). A cut is taken when every
    partition's last stable offset equals its high watermark queried after it (no partition held an
    undecided record, so no commit was half-way through landing on its partitions), or when a
    partition holds an open transaction but no last stable offset has moved for _STILL_SECONDS (no
    commit is landing). `step` says True once every record below the cut has been read: the book
    then holds every transaction below it in full and none in part; records read past the cut wait
    for the next one. No look needs the topics to be idle, so under sustained load each commit is in
    the book within a few steps.
    """

    def __init__(self, settings: Settings, *, with_late: bool = True) -> None:
        self.settings = settings
        self.with_late = with_late
        self.records = 0
        self._readers: list[tuple[TopicReader, str, Codec]] = []
        self._held: dict[int, list[SinkRecord]] = {}  # per reader: read, not yet below a cut
        self._target: Cut | None = None  # the cut being read towards
        self._last_ends: Cut | None = None  # the last stable offsets at the previous look
        self._ends_since = 0.0  # when they last moved (monotonic)
        self._gate: WindowGate | None = None
        # The gate's limit when the cut being read towards was taken (None: no limit), and the
        # final results read below a cut whose window ended past its limit: shown later.
        self._limit: int | None = None
        self._waiting: list[IpCount] = []

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
            self._gate = WindowGate(s)
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
        if self._gate is not None:
            self._gate.close()
            self._gate = None

    @property
    def waiting(self) -> int:
        """Final results read but not shown yet: their batch's other shares are not all in."""
        return len(self._waiting)

    def _apply(
        self, book: WindowBook, records: Iterable[SinkRecord], kind: str, codec: Codec
    ) -> int:
        n = 0
        for _, result in decode_records(records, codec):
            if kind == "final" and self._limit is not None and result.window_end > self._limit:
                self._waiting.append(result)
            else:
                self._add(book, result, kind)
            n += 1
        self.records += n
        return n

    @staticmethod
    def _add(book: WindowBook, result: IpCount, kind: str) -> None:
        if not book.add(result, kind):
            logger.debug("not shown (window older than the kept ones): %s %s", kind, result)

    def catch_up(self, book: WindowBook, stall_seconds: float = 30.0) -> None:
        """Read both topics into `book` up to a cut taken after this call began: every
        transaction committed before it is in the book in full, none in part. No overall
        deadline: a long topic takes as long as it takes while records keep coming; an open
        transaction does not hold it back (read_committed stops before it, and so does this).

        Raises:
            IpcountError: no record arrived and no position moved for `stall_seconds` while
                records remained to read.
            BrokerError: the end offsets could not be queried (the broker is unreachable).
            DecodeError: a record is not an IpCount.
        """
        mark, since = self._progress(), time.monotonic()
        while not self.step(book):
            now = self._progress()
            if now != mark:
                mark, since = now, time.monotonic()
            elif time.monotonic() - since > stall_seconds:
                behind = self._behind()
                if behind:
                    raise IpcountError(
                        f"reading {', '.join(behind)} made no progress for {stall_seconds:g}s "
                        "with records left to read: is the broker overloaded or going away? "
                        "(kafka.bootstrap_servers)"
                    )
                since = time.monotonic()  # everything read: the next look takes a cut

    def _progress(self) -> tuple[int, int]:
        """Records read and the sum of all positions (which also move past aborted records
        and transaction markers)."""
        held = sum(len(h) for h in self._held.values())
        return self.records + held, sum(sum(r.positions().values()) for r, _, _ in self._readers)

    def _behind(self) -> list[str]:
        """Topics with a partition whose position is below its readable end."""
        out = []
        for reader, _, _ in self._readers:
            pos, ends = reader.positions(), reader.ends()
            if any(pos.get(p, 0) < end for p, end in ends.items()):
                out.append(reader.topic)
        return out

    def step(self, book: WindowBook) -> bool:
        """One look at each topic, applying to `book` what arrived below the cut being read
        towards. Returns True when every record below that cut has been read (then the book
        holds every transaction committed below it in full, none in part); idle topics answer
        True at every step.

        Raises:
            BrokerError: the end offsets could not be queried (the broker is unreachable).
            DecodeError: a record is not an IpCount.
        """
        if self._gate is not None:
            self._gate.poll(timeout=0)
        for i, (reader, kind, codec) in enumerate(self._readers):
            records = reader.poll(timeout=_POLL_SECONDS)
            if records:
                self._held.setdefault(i, []).extend(records)
        if self._target is None:
            self._target = self._next_cut()
            if self._target is None:
                return False
        self._release(book, self._target)
        if not self._reached(self._target):
            return False
        self._target = None
        return True

    def _next_cut(self) -> Cut | None:
        """The last stable offsets of every partition if they are a cut between whole
        transactions (see the class docstring), else None (look again at the next step). The
        gate's limit is read first: what it vouches for was committed before these ends."""
        limit = None if self._gate is None else self._gate.limit()
        ends: Cut = {}
        for i, (reader, _, _) in enumerate(self._readers):
            ends.update({(i, p): end for p, end in reader.ends().items()})
        # Queried after the ends: a high watermark equal to a partition's last stable offset
        # then says nothing on it was undecided when its last stable offset was read.
        highs: Cut = {}
        for i, (reader, _, _) in enumerate(self._readers):
            highs.update({(i, p): high for p, high in reader.high_watermarks().items()})
        now = time.monotonic()
        if ends != self._last_ends:
            self._last_ends, self._ends_since = ends, now
        if all(end >= highs.get(key, end) for key, end in ends.items()) or (
            now - self._ends_since >= _STILL_SECONDS  # an open transaction, no commit landing
        ):
            self._limit = limit
            return ends
        return None

    def _release(self, book: WindowBook, cut: Cut) -> None:
        """Apply the held records below `cut` to `book`, in the order read; keep the rest."""
        if self._waiting:
            waiting, self._waiting = self._waiting, []
            for result in waiting:
                if self._limit is None or result.window_end <= self._limit:
                    self._add(book, result, "final")
                else:
                    self._waiting.append(result)
        for i, held in self._held.items():
            if not held:
                continue
            below = [r for r in held if r.offset < cut.get((i, r.partition), 0)]
            if below:
                _, kind, codec = self._readers[i]
                self._held[i] = [r for r in held if r.offset >= cut.get((i, r.partition), 0)]
                self._apply(book, below, kind, codec)

    def _reached(self, cut: Cut) -> bool:
        for i, (reader, _, _) in enumerate(self._readers):
            pos = reader.positions()
            if any(pos.get(p, 0) < end for (j, p), end in cut.items() if j == i):
                return False
        return True
