"""`ipcount verify` after bounded runs of the real job: windows the job keeps open (they end after
the watermark its last committed batch had, recorded in the sink's progress marker) are reported
as open=, not missing=, and do not make the run inexact; a result that is really absent from a
closed window is missing."""

from __future__ import annotations

import re
from pathlib import Path

from ipcount.kafka.topics import ensure_topics
from ipcount.verify.ledger import Ledger


def _fields(line: str) -> dict[str, str]:
    return dict(re.findall(r"(\w+)=(\S+)", line))


def _verify(ipcount_cli, settings, ledger: Ledger, path: Path):  # type: ignore[no-untyped-def]
    ledger.save(path)
    done = ipcount_cli(settings, "verify", "--ledger", str(path), timeout=120)
    lines = done.stdout.strip().splitlines()
    assert lines, done.stderr[-3000:]
    print("verify:", *lines[-3:], sep="\n  ")
    return done, lines


def test_verify_tells_open_windows_from_missing_ones(  # type: ignore[no-untyped-def]
    make_settings, ipcount_cli, Feed, tmp_path
) -> None:
    settings = make_settings()
    ensure_topics(settings)
    feed = Feed(settings)
    # 20 event-seconds of 10 IPs: the newest event is t0+19 s, so with the 5 s watermark delay a
    # bounded run emits [t0, t0+5 s) and [t0+5 s, t0+10 s) and keeps the last two windows open.
    feed.round(0, 20)
    first = ipcount_cli(settings, "run", "--available-now")
    assert first.returncode == 0, first.stderr[-3000:]

    done, lines = _verify(ipcount_cli, settings, feed.ledger, tmp_path / "ledger.jsonl")
    last = _fields(lines[-1])
    assert done.returncode == 0, done.stdout + done.stderr[-2000:]
    assert int(last["open"]) > 0 and last["missing"] == "0" and last["exact"] == "true", lines
    assert int(last["open"]) + int(last["results"]) == len(feed.ledger.counts), lines
    assert lines[-1].endswith("missing=0 duplicates=0 wrong=0 exact=true"), lines[-1]
    text = "\n".join(lines[:-1])
    assert "progress marker" in text and "--close-all-windows" in text, text

    # A result that is really absent: the ledger holds a client in a window the watermark passed.
    lossy = Ledger(window_ms=5000)
    lossy.merge(feed.ledger)
    lossy.add(feed.t0 + 1_000, "10.9.9.9", 1)
    done, lines = _verify(ipcount_cli, settings, lossy, tmp_path / "lossy.jsonl")
    last = _fields(lines[-1])
    assert done.returncode == 1, lines
    assert (last["missing"], last["exact"]) == ("1", "false"), lines
    assert int(last["open"]) > 0, lines
    assert f"missing window_start={feed.t0} ip=10.9.9.9 expected count=1" in done.stdout

    # The input is finished: closing every window leaves nothing open.
    closing = ipcount_cli(settings, "run", "--available-now", "--close-all-windows")
    assert closing.returncode == 0, closing.stderr[-3000:]
    done, lines = _verify(ipcount_cli, settings, feed.ledger, tmp_path / "ledger.jsonl")
    last = _fields(lines[-1])
    assert done.returncode == 0, done.stdout + done.stderr[-2000:]
    assert (last["open"], last["missing"], last["exact"]) == ("0", "0", "true"), lines
    assert last["results"] == str(len(feed.ledger.counts)), lines
