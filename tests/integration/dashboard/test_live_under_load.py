"""The live view under sustained load, as in `ipcount demo`: a real job committing a transaction
every second while `loadgen synth` writes ~2,500 records/s. `ipcount top --follow` and the
dashboard's /api/top must show each window within 3 s of the sink commit that holds it, and show
it whole (the totals the sink topic holds), never a transaction read in part."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from ipcount.config import Settings
from ipcount.formats.avro import make_codec
from ipcount.kafka.records import decode_records
from ipcount.kafka.topic_reader import TopicReader
from ipcount.kafka.topics import ensure_topics
from ipcount.local.broker import free_port

ROOT = Path(__file__).resolve().parents[3]
pytestmark = [pytest.mark.e2e, pytest.mark.slow]

RATE = 2500
LOAD_SECONDS = 32  # six windows or more commit under load (five are asserted)
MAX_DELAY = 3.0


class _Proc:
    """A child process (own log file), stopped by its PID."""

    def __init__(self, args: list[str], env: dict[str, str], log: Path, **kw: Any) -> None:
        self.log = log
        self.proc = subprocess.Popen(
            [sys.executable, *args], cwd=ROOT, env=env, stderr=log.open("w"), **kw
        )

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)


def _top_reader(proc: subprocess.Popen[str], seen: dict[int, tuple[float, int]]) -> None:
    """Each window's first block from `top --follow --json`: when it was printed, its total."""
    assert proc.stdout is not None
    for line in proc.stdout:
        block = json.loads(line)
        if not block["update"]:
            seen.setdefault(block["window_start"], (time.time(), block["total"]))


def _api_poller(url: str, seen: dict[int, tuple[float, int]], stop: threading.Event) -> None:
    """Each window's first appearance in /api/top, polled every 0.1 s."""
    while not stop.is_set():
        try:
            with urllib.request.urlopen(url, timeout=5) as resp:  # noqa: S310 - a local test URL
                got = json.loads(resp.read())
        except OSError:
            stop.wait(0.2)
            continue
        now = time.time()
        for w in got["windows"]:
            seen.setdefault(w["window_start"], (now, w["total"]))
        stop.wait(0.1)


def _committed(settings: Settings) -> dict[int, tuple[float, int]]:
    """Per window in the sink topic: when the transaction holding it wrote it (the records'
    CreateTime, set as the sink produced them just before committing) and its total."""
    codec = make_codec(settings.sink.wire_format, settings.sink.schema_registry_url, "")
    out: dict[int, tuple[float, int]] = {}
    conf = settings.kafka.to_librdkafka("consumer")
    with TopicReader(conf, settings.topics.sink) as reader:
        for rec, r in decode_records(reader.read_to_end(), codec):
            at, total = out.get(r.window_start, (0.0, 0))
            out[r.window_start] = (max(at, rec.timestamp_ms / 1000), total + r.count)
    return out


def _sink_end(settings: Settings) -> int:
    conf = settings.kafka.to_librdkafka("consumer")
    with TopicReader(conf, settings.topics.sink) as reader:
        return sum(reader.ends().values())


def test_top_follow_and_dashboard_show_each_window_within_3s_of_its_commit(
    make_settings: Callable[..., Settings],
    ipcount_env: Callable[..., dict[str, str]],
    tmp_path: Path,
) -> None:
    settings = make_settings()
    ensure_topics(settings)
    env = ipcount_env(settings)
    port = free_port()
    top_seen: dict[int, tuple[float, int]] = {}
    api_seen: dict[int, tuple[float, int]] = {}
    stop = threading.Event()
    procs: list[_Proc] = []
    try:
        job = _Proc(["-m", "ipcount", "run"], env, tmp_path / "job.log")
        procs.append(job)
        synth = _Proc(
            ["-m", "loadgen", "synth", "--rate", str(RATE), "--duration", "600"],
            env,
            tmp_path / "synth.log",
        )
        procs.append(synth)
        # The job's start-up (Spark, its first batch over the backlog) is not what is measured.
        deadline = time.monotonic() + 120
        while _sink_end(settings) == 0:
            assert time.monotonic() < deadline, job.log.read_text()[-3000:]
            assert job.proc.poll() is None, job.log.read_text()[-3000:]
            time.sleep(1)
        top = _Proc(
            ["-m", "ipcount", "top", "--follow", "--json", "--n", "3"],
            env,
            tmp_path / "top.log",
            stdout=subprocess.PIPE,
            text=True,
        )
        procs.append(top)
        threading.Thread(target=_top_reader, args=(top.proc, top_seen), daemon=True).start()
        dash = _Proc(["-m", "ipcount", "dashboard", "--port", str(port)], env, tmp_path / "d.log")
        procs.append(dash)
        url = f"http://127.0.0.1:{port}/api/top?n=3"
        threading.Thread(target=_api_poller, args=(url, api_seen, stop), daemon=True).start()
        while not (top_seen and api_seen):  # both have read the backlog
            assert time.monotonic() < deadline, (top.log.read_text(), dash.log.read_text())
            time.sleep(0.2)
        follow_start = time.time()
        time.sleep(LOAD_SECONDS)
        follow_end = time.time()
        time.sleep(MAX_DELAY + 1)
        for p in procs:
            assert p.proc.poll() is None, p.log.read_text()[-3000:]
    finally:
        stop.set()
        for p in reversed(procs):
            p.stop()

    committed = _committed(settings)
    under_load = sorted(w for w, (at, _) in committed.items() if follow_start < at < follow_end)
    assert len(under_load) >= 5, (committed, follow_start, follow_end)
    report = []
    for name, seen in (("top --follow", top_seen), ("/api/top", api_seen)):
        delays = {}
        for w in under_load:
            assert w in seen, f"{name} never showed window {w}: saw {sorted(seen)}"
            shown_at, total = seen[w]
            # Whole, never part of a transaction: the total the sink holds for the window.
            assert total == committed[w][1], (name, w, total, committed[w][1])
            delays[w] = shown_at - committed[w][0]
        report.append(f"{name}: commit -> shown, s: {sorted(round(d, 2) for d in delays.values())}")
        assert max(delays.values()) <= MAX_DELAY, report
    print("\n".join(report))
