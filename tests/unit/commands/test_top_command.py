"""`ipcount top` over a scripted feed (no broker): a window the job commits while top reads is
shown whole or not at all, a long backlog has no overall deadline, --last bounds what is printed
and held, and the notes on stderr say what was not shown."""

from __future__ import annotations

import argparse
import dataclasses
import json
import time
from typing import Any

import pytest

from ipcount.commands import top
from ipcount.dashboard.feed import ResultFeed
from ipcount.dashboard.model import WindowBook
from ipcount.errors import IpcountError
from ipcount.formats.avro import IpCount, SingleObjectCodec
from ipcount.kafka.records import SinkRecord

CODEC = SingleObjectCodec()
W = 5000
T0 = 1_700_000_000_000  # 2023-11-14T22:13:20Z


def _r(window: int, ip: str, count: int) -> IpCount:
    start = T0 + window * W
    return IpCount(start, start + W, ip, count)


# One poll of the script: records the job commits now (partition, result), then the partitions
# whose next record this poll delivers (a fetch returns some partitions before others), and
# optionally the partitions where the commit marker has not landed yet during this poll (their
# written records are undecided, not shown by read_committed).
Step = (
    tuple[list[tuple[int, IpCount]], list[int]]
    | tuple[list[tuple[int, IpCount]], list[int], list[int]]
)


class FakeReader:
    """A read_committed TopicReader over a scripted topic: `log` is what is written, `visible`
    how much of each partition is committed (its last stable offset)."""

    def __init__(self, topic: str, log: dict[int, list[IpCount]], script: list[Step]) -> None:
        self.topic = topic
        self.log = log
        self.script = list(script)
        self.pos = dict.fromkeys(log, 0)
        self.visible = {p: len(records) for p, records in log.items()}

    def poll(self, max_records: int = 10_000, timeout: float = 0.5) -> list[SinkRecord]:
        step = self.script.pop(0) if self.script else ([], list(self.log))
        commits, deliver = step[0], step[1]
        undecided = step[2] if len(step) > 2 else []  # type: ignore[misc]
        for p, result in commits:
            self.log[p].append(result)
        for p in self.log:
            if p not in undecided:
                self.visible[p] = len(self.log[p])
        out = []
        for p in deliver:
            if self.pos[p] < self.visible[p]:
                value = CODEC.encode(dataclasses.asdict(self.log[p][self.pos[p]]))
                out.append(SinkRecord(self.topic, p, self.pos[p], None, value, 0))
                self.pos[p] += 1
        return out

    def ends(self) -> dict[int, int]:
        return dict(self.visible)

    def caught_up(self) -> bool:
        return all(self.pos[p] >= end for p, end in self.visible.items())

    def high_watermarks(self) -> dict[int, int]:
        return {p: len(records) for p, records in self.log.items()}

    def positions(self) -> dict[int, int]:
        return dict(self.pos)

    def read_to_end(self, deadline_seconds: float = 60.0) -> Any:
        # As TopicReader's: until each partition passes its end as it was at the start.
        ends = {p: len(log) for p, log in self.log.items()}
        while any(self.pos[p] < ends[p] for p in ends):
            yield from self.poll()

    def close(self) -> None:
        pass


class FakeFeed(ResultFeed):
    def __init__(self, *readers: tuple[FakeReader, str]) -> None:
        super().__init__(None, with_late=True)  # type: ignore[arg-type]
        self.fakes = readers
        self.most_windows = 0

    def open(self) -> None:
        self._readers = [(r, kind, CODEC) for r, kind in self.fakes]  # type: ignore[misc]

    def _apply(self, book: WindowBook, records: Any, kind: str, codec: Any) -> int:
        n = super()._apply(book, records, kind, codec)
        self.most_windows = max(self.most_windows, len(book))
        return n


def run_top(monkeypatch: pytest.MonkeyPatch, feed: FakeFeed, *argv: str) -> int:
    parser = argparse.ArgumentParser()
    top.register(parser.add_subparsers())
    args = parser.parse_args(["top", *argv])
    monkeypatch.setattr(top, "ResultFeed", lambda settings, with_late: feed)
    return top.run(args, None)  # type: ignore[arg-type]


def blocks(out: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in out.splitlines()]


def test_a_window_committed_while_top_reads_is_shown_whole(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # Window 0 is committed at the start; the job commits window 1 (both partitions) during the
    # first fetch, which brings partition 0's part of it but not yet partition 1's.
    sink = FakeReader(
        "sink",
        {0: [_r(0, "10.0.0.1", 5)], 1: [_r(0, "10.0.0.2", 4)]},
        [([(0, _r(1, "10.0.0.1", 7)), (1, _r(1, "10.0.0.2", 9))], [0, 1, 0]), ([], [1])],
    )
    assert run_top(monkeypatch, FakeFeed((sink, "final")), "--json") == 0
    got = blocks(capsys.readouterr().out)
    assert [(b["window_start"], b["total"]) for b in got] == [(T0, 9), (T0 + W, 16)]


def test_a_commit_landing_on_one_partition_before_another_is_never_shown_in_part() -> None:
    # Window 1's commit marker lands on partition 0 two polls before partition 1: meanwhile
    # read_committed shows partition 0's part of it and not yet partition 1's.
    commit = [(0, _r(1, "10.0.0.1", 7)), (1, _r(1, "10.0.0.2", 9))]
    sink = FakeReader(
        "sink",
        {0: [_r(0, "10.0.0.1", 5)], 1: [_r(0, "10.0.0.2", 4)]},
        [([], [0, 1]), (commit, [0, 1], [1]), ([], [0, 1], [1])],
    )
    feed = FakeFeed((sink, "final"))
    feed.open()
    book = WindowBook()
    shown = []
    for _ in range(6):
        if feed.step(book):
            shown.append([(w.window_start, w.total) for w in book.top(2)])
    assert shown and all(s in ([(T0, 9)], [(T0, 9), (T0 + W, 16)]) for s in shown), shown
    assert shown[-1] == [(T0, 9), (T0 + W, 16)]


def test_an_open_transaction_that_stays_open_holds_nothing_back_for_long(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # A stopped job left a transaction open on partition 1 (until the broker aborts it): what
    # was committed before it is shown once no last stable offset has moved for a while.
    from ipcount.dashboard import feed as feed_module

    monkeypatch.setattr(feed_module, "_STILL_SECONDS", 0.3)
    stuck: list[Step] = [([(1, _r(1, "10.0.0.2", 9))], [0, 1], [1])]
    stuck += [([], [0, 1], [1])] * 1000
    sink = FakeReader("sink", {0: [_r(0, "10.0.0.1", 5)], 1: [_r(0, "10.0.0.2", 4)]}, stuck)
    feed = FakeFeed((sink, "final"))
    feed.open()
    book = WindowBook()
    start = time.monotonic()
    while not feed.step(book):
        assert time.monotonic() - start < 5, "never shown"
        time.sleep(0.02)
    assert time.monotonic() - start >= 0.3
    assert [(w.window_start, w.total) for w in book.top(2)] == [(T0, 9)]


def test_windows_are_shown_while_commits_keep_coming() -> None:
    # A commit lands before every poll (sustained load): the topics are never idle, yet every
    # window is shown, whole, a step or two after its commit.
    n = 12
    script: list[Step] = [
        ([(0, _r(i, "10.0.0.1", 1)), (1, _r(i, "10.0.0.2", 2))], [0, 1]) for i in range(n)
    ]
    sink = FakeReader("sink", {0: [], 1: []}, script)
    feed = FakeFeed((sink, "final"))
    feed.open()
    book = WindowBook()
    shown_at: dict[int, int] = {}
    for step in range(n):
        if feed.step(book):
            for w in book.top(2):
                assert w.total == 3, (step, w)  # whole, never one partition's part
                shown_at.setdefault(w.window_start, step)
    assert all(shown_at.get(T0 + i * W, n) <= i + 2 for i in range(n - 2)), shown_at


def test_a_long_backlog_is_read_to_its_end_while_records_keep_coming() -> None:
    class Slow(FakeReader):
        def poll(self, max_records: int = 10_000, timeout: float = 0.5) -> list[SinkRecord]:
            time.sleep(0.05)  # one record per slow poll: far longer in all than the stall limit
            return super().poll()

    n = 12
    feed = FakeFeed((Slow("sink", {0: [_r(i, "10.0.0.1", 1) for i in range(n)]}, []), "final"))
    feed.open()
    book = WindowBook()
    start = time.monotonic()
    feed.catch_up(book, stall_seconds=0.2)
    assert time.monotonic() - start > 2 * 0.2
    assert len(book) == n


def test_a_read_that_makes_no_progress_stops_with_a_clear_error() -> None:
    class Stuck(FakeReader):
        def poll(self, max_records: int = 10_000, timeout: float = 0.5) -> list[SinkRecord]:
            time.sleep(0.02)
            return []  # records are there (not caught up) but never arrive

    feed = FakeFeed((Stuck("ip_count_sink", {0: [_r(0, "10.0.0.1", 1)]}, []), "final"))
    feed.open()
    with pytest.raises(IpcountError, match=r"ip_count_sink made no progress for 0\.2s"):
        feed.catch_up(WindowBook(), stall_seconds=0.2)


def test_last_prints_and_holds_only_the_newest_windows(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    log = {
        0: [_r(i, "10.0.0.1", i + 1) for i in range(10)],
        1: [_r(i, "10.0.0.2", 1) for i in range(10)],
    }
    late = FakeReader("late", {0: [_r(1, "10.0.0.1", 1), _r(9, "10.0.0.1", 100)]}, [])
    feed = FakeFeed((FakeReader("sink", log, []), "final"), (late, "late"))
    assert run_top(monkeypatch, feed, "--json", "--last", "3") == 0
    out = capsys.readouterr()
    got = blocks(out.out)
    assert [b["window_start"] for b in got] == [T0 + i * W for i in (7, 8, 9)]
    assert got[-1]["total"] == 10 + 1 + 100
    assert feed.most_windows <= 3
    assert out.err == ""  # --last asked for the older windows to be left out


def test_the_notes_say_which_records_were_not_shown(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # Partition 0 is read before partition 1: the latter's results for windows 0 and 1 come
    # when windows 2 and 3 are kept.
    results = {p: [_r(i, f"10.0.0.{p + 1}", 1) for i in range(4)] for p in (0, 1)}
    sink = FakeReader("sink", results, [([], [0])] * 4)
    # While following, a correction comes for window 0, no longer kept.
    late = FakeReader("late", {0: []}, [([], [0])] * 3 + [([(0, _r(0, "10.0.0.1", 1))], [0])])
    feed = FakeFeed((sink, "final"), (late, "late"))
    args = ("--follow", "--keep", "2", "--idle-exit", "0.5")
    assert run_top(monkeypatch, feed, *args) == 0
    err = capsys.readouterr().err.splitlines()
    assert err == [
        "note: 2 final results for windows older than the newest 2 were skipped while reading "
        "the backlog (raise --keep to keep more)",
        "note: 1 late correction for windows older than the newest 2 was not shown (raise "
        "--keep to keep more)",
    ]


def test_last_and_keep_are_not_given_together(monkeypatch: pytest.MonkeyPatch) -> None:
    feed = FakeFeed()
    with pytest.raises(SystemExit, match="--last and --keep"):
        run_top(monkeypatch, feed, "--follow", "--last", "3", "--keep", "5")
