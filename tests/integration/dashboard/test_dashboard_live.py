"""`ipcount top` and `ipcount dashboard` as a user runs them, against sink and late topics written
by the sink's own transactional code: the same top-N from both, ties, late corrections, a window
only late records reached, --follow's corrections block, and clear errors."""

from __future__ import annotations

import dataclasses
import json
import os
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from ipcount.config import Settings
from ipcount.formats.avro import IpCount, SingleObjectCodec
from ipcount.kafka.topics import ensure_topics
from ipcount.local.broker import free_port
from ipcount.sink.producer_config import TxnConfig
from ipcount.sink.transaction import TxnSession

ROOT = Path(__file__).resolve().parents[3]
CODEC = SingleObjectCodec()
W = 5000
T0 = 1_700_000_000_000  # 2023-11-14T22:13:20Z


def _r(window: int, ip: str, count: int) -> IpCount:
    start = T0 + window * W
    return IpCount(start, start + W, ip, count)


# batch 0: window 0's results (three IPs tied at 30: shown in address order)
# batch 1: window 1's results; corrections for window 0 (one moves 10.0.0.3 to the top, one is an
#          IP only late records reached)
# batch 2: corrections only: window 0 again, and window 2 that only late records reached
BATCHES: list[tuple[list[IpCount], list[IpCount]]] = [
    (
        [
            _r(0, "10.0.0.1", 50),
            _r(0, "10.0.0.10", 30),
            _r(0, "10.0.0.3", 30),
            _r(0, "2001:db8::1", 5),
            _r(0, "10.0.0.2", 30),
        ],
        [],
    ),
    ([_r(1, "10.0.0.1", 7), _r(1, "10.0.0.4", 9)], [_r(0, "10.0.0.3", 25), _r(0, "10.0.0.9", 1)]),
    ([], [_r(0, "10.0.0.3", 1), _r(2, "10.0.0.5", 4)]),
]

EXPECTED_TOP3 = [
    {
        "window_start": T0,
        "window_end": T0 + W,
        "total": 172,
        "late": 27,
        "ips": 6,
        "final": True,
        "top": [
            {"ip": "10.0.0.3", "count": 56, "late": 26, "share": 56 / 172},
            {"ip": "10.0.0.1", "count": 50, "late": 0, "share": 50 / 172},
            {"ip": "10.0.0.2", "count": 30, "late": 0, "share": 30 / 172},
        ],
    },
    {
        "window_start": T0 + W,
        "window_end": T0 + 2 * W,
        "total": 16,
        "late": 0,
        "ips": 2,
        "final": True,
        "top": [
            {"ip": "10.0.0.4", "count": 9, "late": 0, "share": 9 / 16},
            {"ip": "10.0.0.1", "count": 7, "late": 0, "share": 7 / 16},
        ],
    },
    {
        "window_start": T0 + 2 * W,
        "window_end": T0 + 3 * W,
        "total": 4,
        "late": 4,
        "ips": 1,
        "final": False,
        "top": [{"ip": "10.0.0.5", "count": 4, "late": 4, "share": 1.0}],
    },
]


class Sink:
    """The sink's transactional session for one query: results and corrections per batch."""

    def __init__(self, settings: Settings) -> None:
        qid = f"q-{uuid.uuid4().hex[:8]}"
        self.settings = settings
        self.batch = 0
        self.session = TxnSession(
            TxnConfig(
                topic=settings.topics.sink,
                progress_topic=settings.topics.progress,
                query_id=qid,
                transactional_id=f"ipcount-{qid}",
                producer_conf=settings.kafka.to_librdkafka("producer"),
                consumer_conf=settings.kafka.to_librdkafka("consumer"),
                late_topic=settings.topics.late,
            )
        )

    def commit(self, results: list[IpCount], late: list[IpCount]) -> None:
        records: list[Any] = [(r.ip.encode(), CODEC.encode(dataclasses.asdict(r))) for r in results]
        records += [
            (r.ip.encode(), CODEC.encode(dataclasses.asdict(r)), None, self.settings.topics.late)
            for r in late
        ]
        assert self.session.commit_batch(self.batch, records).status == "committed"
        self.batch += 1


def cli_cmd(settings: Settings, *args: str) -> tuple[list[str], dict[str, str]]:
    sets = [
        f"kafka.bootstrap_servers={settings.kafka.bootstrap_servers}",
        f"topics.sink={settings.topics.sink}",
        f"topics.late={settings.topics.late}",
    ]
    cmd = [sys.executable, "-m", "ipcount", "-c", str(ROOT / "conf" / "ipcount.toml")]
    for item in sets:
        cmd += ["--set", item]
    env = {k: v for k, v in os.environ.items() if not k.startswith("IPCOUNT_")}
    return [*cmd, *args], env


def cli(settings: Settings, *args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    cmd, env = cli_cmd(settings, *args)
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, cwd=ROOT, env=env)


def get_json(url: str) -> Any:
    with urllib.request.urlopen(url, timeout=5) as resp:  # noqa: S310 - a local test URL
        return json.loads(resp.read())


class Dashboard:
    """`ipcount dashboard` as a subprocess on a free port."""

    def __init__(self, settings: Settings, *args: str) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}/"
        cmd, env = cli_cmd(settings, "dashboard", "--port", str(self.port), *args)
        self.proc = subprocess.Popen(
            cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise AssertionError(f"dashboard exited: {self.proc.communicate()}")
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=1).close()
                return
            except OSError:
                time.sleep(0.2)
        raise AssertionError("dashboard did not listen within 60 s")

    def top(self, n: int, windows: int, deadline: float = 30) -> list[dict[str, Any]]:
        """/api/top?n=N once it holds `windows` windows."""
        end = time.monotonic() + deadline
        while True:
            got = get_json(f"{self.url}api/top?n={n}")
            if len(got["windows"]) >= windows or time.monotonic() > end:
                return list(got["windows"])
            time.sleep(0.3)

    def stop(self) -> tuple[int, str]:
        self.proc.terminate()
        _, err = self.proc.communicate(timeout=30)
        return self.proc.returncode, err


@pytest.fixture
def written(make_settings: Callable[..., Settings]) -> Settings:
    settings = make_settings()
    ensure_topics(settings)
    sink = Sink(settings)
    for results, late in BATCHES:
        sink.commit(results, late)
    return settings


@pytest.fixture
def dashboard(written: Settings) -> Iterator[Dashboard]:
    d = Dashboard(written)
    try:
        yield d
    finally:
        d.stop()


def test_top_prints_every_window_with_corrected_totals(written: Settings) -> None:
    out = cli(written, "top", "--n", "3", "--json")
    assert out.returncode == 0, out.stderr
    got = [json.loads(line) for line in out.stdout.splitlines()]
    assert [{k: v for k, v in g.items() if k != "update"} for g in got] == EXPECTED_TOP3
    assert not any(g["update"] for g in got)

    out = cli(written, "top", "--n", "3")
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines()[:4] == [
        "window 2023-11-14T22:13:20Z +5s  172 requests from 6 IPs, 27 of them late",
        "22:13:20Z  10.0.0.3            56   32.6%  (+26 late)",
        "22:13:20Z  10.0.0.1            50   29.1%",
        "22:13:20Z  10.0.0.2            30   17.4%",
    ]
    assert "window 2023-11-14T22:13:30Z +5s  4 requests from 1 IPs, 4 of them late " in out.stdout


def test_top_last_prints_only_the_newest_windows(written: Settings) -> None:
    out = cli(written, "top", "--n", "3", "--json", "--last", "2")
    assert out.returncode == 0, out.stderr
    got = [json.loads(line) for line in out.stdout.splitlines()]
    assert [{k: v for k, v in g.items() if k != "update"} for g in got] == EXPECTED_TOP3[1:]


def test_dashboard_data_endpoint_gives_the_same_top_n_as_top(
    written: Settings, dashboard: Dashboard
) -> None:
    for n in (1, 3, 10):
        out = cli(written, "top", "--n", str(n), "--json")
        assert out.returncode == 0, out.stderr
        from_top = [
            {k: v for k, v in json.loads(line).items() if k != "update"}
            for line in out.stdout.splitlines()
        ]
        assert dashboard.top(n, len(from_top)) == from_top
    assert dashboard.top(3, 3) == EXPECTED_TOP3

    feed = get_json(f"{dashboard.url}api/top?n=3")["feed"]
    assert feed["sink"] == written.topics.sink and feed["late"] == written.topics.late
    assert feed["error"] is None and feed["caught_up_at"] is not None
    health = get_json(f"{dashboard.url}api/health")
    assert health["status"] == "none" and "--metrics-url" in health["message"]
    with pytest.raises(urllib.error.HTTPError) as bad:
        get_json(f"{dashboard.url}api/top?n=0")
    assert bad.value.code == 400


def test_dashboard_follows_new_commits(written: Settings, dashboard: Dashboard) -> None:
    assert len(dashboard.top(2, 3)) == 3
    sink = Sink(written)
    sink.commit([_r(3, "10.0.0.7", 11)], [_r(1, "10.0.0.1", 5)])
    windows = dashboard.top(2, 4)
    assert [w["window_start"] for w in windows] == [T0 + i * W for i in range(4)]
    assert windows[1]["top"][0] == {"ip": "10.0.0.1", "count": 12, "late": 5, "share": 12 / 21}
    assert windows[3]["top"] == [{"ip": "10.0.0.7", "count": 11, "late": 0, "share": 1.0}]


def test_top_follow_prints_new_windows_then_one_corrections_block(written: Settings) -> None:
    cmd, env = cli_cmd(written, "top", "--n", "2", "--follow", "--idle-exit", "6")
    proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        backlog = [proc.stdout.readline() for _ in range(3 + 3 + 2)]  # 3 headers, 5 rows
        assert backlog[0].startswith("window 2023-11-14T22:13:20Z")
        Sink(written).commit([_r(3, "10.0.0.7", 11)], [_r(1, "10.0.0.1", 5)])
        rest, _ = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0
    assert rest.splitlines() == [
        "window 2023-11-14T22:13:35Z +5s  11 requests from 1 IPs",
        "22:13:35Z  10.0.0.7            11  100.0%",
        "corrections  5 late records for 1 earlier window:",
        "  22:13:25Z +5s  +5 late: 21 requests from 2 IPs (was 16)",
    ]


def test_missing_topics_and_a_busy_port_are_clear_errors(
    make_settings: Callable[..., Settings], dashboard: Dashboard, written: Settings
) -> None:
    fresh = make_settings()
    for args in (("top",), ("dashboard", "--port", str(free_port()))):
        out = cli(fresh, *args)
        assert out.returncode == 1, out
        assert "does not exist" in out.stderr and "ipcount topics create" in out.stderr

    out = cli(written, "dashboard", "--port", str(dashboard.port))
    assert out.returncode == 1
    assert f"cannot listen on 127.0.0.1:{dashboard.port}" in out.stderr
    assert "choose another --port" in out.stderr


def test_dashboard_health_comes_from_the_jobs_metrics_endpoint(written: Settings) -> None:
    from prometheus_client import CollectorRegistry, Gauge, start_http_server

    reg = CollectorRegistry()
    lag = Gauge("ipcount_source_lag_records", "lag", ["topic", "partition"], registry=reg)
    lag.labels("src", "0").set(40)
    lag.labels("src", "1").set(2)
    Gauge("ipcount_query_up", "up", registry=reg).set(1)
    port = free_port()
    server, thread = start_http_server(port, addr="127.0.0.1", registry=reg)
    d = Dashboard(written, "--metrics-url", f"http://127.0.0.1:{port}/metrics")
    try:
        health = get_json(f"{d.url}api/health")
        assert (health["status"], health["up"], health["lag_records"]) == ("ok", True, 42)
        server.shutdown()
        server.server_close()
        time.sleep(0.6)  # past the half-second cache
        health = get_json(f"{d.url}api/health")
        assert health["status"] == "unreachable" and f"127.0.0.1:{port}" in health["message"]
    finally:
        d.stop()
        server.server_close()
        thread.join(5)
