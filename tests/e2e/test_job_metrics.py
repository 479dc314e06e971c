"""`ipcount run --metrics-port`: what Prometheus and a liveness probe see of a real running job.

One job process: records wait in the source when it starts, and every micro-batch that writes
results fails once inside its transaction (an abortable Kafka error, injected), so the job goes
down and is restarted in-process. /healthz must say 503 while the query is down and 200 once it
runs again; /metrics must end with no lag, every produced record counted once and every
(window, IP) result counted once; the JSON log lines carry the per-batch figures.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import resource
import selectors
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from ipcount.kafka.topics import ensure_topics
from ipcount.local.broker import free_port

ROOT = Path(__file__).resolve().parents[2]


def _start_job(full_env: dict[str, str], port: int, log: Path) -> Any:
    return subprocess.Popen(
        [
            sys.executable,
            "-m",
            "ipcount",
            "--log-format",
            "json",
            "run",
            "--metrics-port",
            str(port),
        ],
        env=full_env,
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
        stderr=log.open("w"),
    )


def _get(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=5) as resp:  # noqa: S310 - the test's own job
            return resp.status, resp.read().decode()
    except urllib.error.HTTPError as err:
        return err.code, err.read().decode()
    except OSError as exc:  # not listening yet
        return 0, str(exc)


def _scrape(base: str) -> dict[str, float]:
    """name{label="v",...} -> value, as Prometheus would store the samples."""
    status, text = _get(base + "/metrics")
    if status != 200:
        return {}
    out = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            labels = ",".join(f'{k}="{v}"' for k, v in sorted(s.labels.items()))
            out[f"{s.name}{{{labels}}}" if labels else s.name] = s.value
    return out


def _wait(what: str, cond: Callable[[], Any], job: Any, log: Path, timeout: float) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        got = cond()
        if got:
            return got
        if job.poll() is not None:
            raise AssertionError(
                f"the job exited ({job.returncode}) while waiting for {what}:\n"
                + log.read_text()[-4000:]
            )
        time.sleep(0.3)
    raise AssertionError(f"timed out waiting for {what}; job log:\n" + log.read_text()[-4000:])


def _lags(samples: dict[str, float]) -> dict[str, float]:
    return {k: v for k, v in samples.items() if k.startswith("ipcount_source_lag_records{")}


def test_metrics_and_health_of_a_running_job(make_settings, tmp_path, Feed, ipcount_env) -> None:  # type: ignore[no-untyped-def]
    settings = make_settings()
    ensure_topics(settings)
    feed = Feed(settings)
    feed.round(0, 30)  # 1,500 records in 6 windows x 10 IPs, waiting before the job starts
    produced, results = 1500, 60
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    log = tmp_path / "job.log"
    env = {
        # Every micro-batch that writes results fails once inside its open transaction.
        "IPCOUNT_FAULTS": ",".join(f"sink.before_commit@{b}/abort" for b in range(200)),
        "IPCOUNT_FAULTS_STATE": str(tmp_path),
        "IPCOUNT_JOB_RESTART_ATTEMPTS": "20",
        # Long enough for /healthz, polled every 0.3 s, to be seen saying the query is down.
        "IPCOUNT_JOB_RESTART_DELAY_SECONDS": "3",
        "IPCOUNT_METRICS_LAG_POLL_SECONDS": "1",
    }
    job = _start_job(ipcount_env(settings, env), port, log)
    try:
        # The endpoint answers before the query runs; nothing has been read yet.
        first = _wait("the metrics endpoint", lambda: _scrape(base), job, log, 120)
        assert first["ipcount_records_total"] == 0
        status, body = _get(base + "/healthz")
        assert (status, body) == (503, "starting: the queries are not running yet\n")

        # The first batch with results fails: the query is down until its restart.
        down = _wait(
            "/healthz to report the failure",
            lambda: (lambda r: r if "failed" in r[1] else None)(_get(base + "/healthz")),
            job,
            log,
            240,
        )
        assert down[1].startswith("query failed:") and "restarting in" in down[1], down
        assert down[1].count("\n") == 1, down
        samples = _scrape(base)
        assert samples["ipcount_query_up"] == 0
        # A restart counts when the query starts again, not while it is pending.
        assert samples["ipcount_query_restarts_total"] == 0

        # Restarted, caught up, every window closed by heartbeats: exact figures.
        def done() -> dict[str, float] | None:
            got = _scrape(base)
            lags = _lags(got)
            ok = (
                got.get("ipcount_query_up") == 1
                and got.get("ipcount_results_total") == results
                and len(lags) == settings.topics.source_partitions
                and all(v == 0 for v in lags.values())
            )
            return got if ok else None

        final = _wait("lag 0 and every result committed", done, job, log, 300)
        assert final["ipcount_records_total"] == produced
        assert final["ipcount_malformed_records_total"] == 0
        assert final["ipcount_late_records_total"] == 0
        assert final["ipcount_heartbeats_total"] >= 1
        committed = final['ipcount_transactions_committed_total{query="ipcount"}']
        aborted = final['ipcount_transactions_aborted_total{query="ipcount"}']
        assert committed >= 1 and aborted == final["ipcount_query_restarts_total"] >= 1
        assert final["ipcount_watermark_timestamp_seconds"] > feed.t0 / 1000
        assert 0 < final["ipcount_watermark_delay_seconds"] < 600
        assert final['ipcount_batch_duration_seconds_count{query="ipcount"}'] >= 2
        assert final["ipcount_last_progress_timestamp_seconds"] > time.time() - 300
        status, body = _get(base + "/healthz")
        assert status == 200 and body.startswith("ok"), body
        fired = sorted(p.name for p in tmp_path.glob("*.fired"))
        assert len(fired) == aborted, (fired, aborted)
    finally:
        if job.poll() is None:
            job.send_signal(signal.SIGTERM)
            job.wait(120)
    assert job.returncode == 0, log.read_text()[-4000:]

    # JSON logs: one object per line; per batch the progress figures are fields.
    batches = []
    for line in log.read_text().splitlines():
        if line.startswith("{"):
            record = json.loads(line)
            # The counting query's batches (the dead-letter query reads the same records).
            progress = record["logger"] == "ipcount.observe.progress" and "batch" in record
            if progress and record.get("query") == "ipcount":
                batches.append(record)
    assert batches, log.read_text()[-3000:]
    assert sum(b["records"] for b in batches) == produced
    # Batch 0 read everything that waited (the source reported lag 0 behind it). A batch replayed
    # after a restart was planned by the failed run, so its source reports no lag (None, "lag=?").
    assert batches[0]["lag"] == 0 and batches[0]["query"] == "ipcount", batches[0]
    assert batches[0]["lag_by_partition"] == {
        f"{settings.topics.source}/{p}": 0 for p in range(settings.topics.source_partitions)
    }
    assert "lag=0" in batches[0]["message"]


def _threads(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/task"))


def _half_open(port: int, n: int) -> list[tuple[socket.socket, float]]:
    """`n` connections that each send half a request and wait, with when each opened."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < n + 500:
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(n + 500, hard), hard))
    out = []
    for _ in range(n):
        sock = socket.create_connection(("127.0.0.1", port), timeout=5)
        sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n")
        out.append((sock, time.monotonic()))
    return out


def _seconds_past(clients: list[tuple[socket.socket, float]], timeout: float) -> list[float]:
    """How long after its bound (opened + timeout, or now if that is past) each connection was
    seen closed by the server; raises if one stays open 10 s past it."""
    sel = selectors.DefaultSelector()
    for sock, opened in clients:
        sock.setblocking(False)
        sel.register(sock, selectors.EVENT_READ, opened)
    watching, late = time.monotonic(), []
    while sel.get_map() and time.monotonic() < watching + timeout + 10:
        for key, _ in sel.select(0.5):
            try:
                key.fileobj.recv(4096)  # type: ignore[union-attr]
            except BlockingIOError:
                continue
            except OSError:
                pass
            late.append(time.monotonic() - max(key.data + timeout, watching))
            sel.unregister(key.fileobj)
    assert not sel.get_map(), f"{len(sel.get_map())} connections still open"
    return late


def _pids_from(log: Path) -> list[int]:
    found = re.findall(r"SIGSTOP to pid (\d+)", log.read_text()) if log.exists() else []
    return [int(p) for p in found]


def test_an_idle_job_stays_healthy_and_a_blocked_one_with_records_waiting_does_not(  # type: ignore[no-untyped-def]
    make_settings, tmp_path, Feed, ipcount_env
) -> None:
    """The default configuration (`ipcount run --metrics-port`): the lag is known (0) while no
    input comes, and idling longer than the stall threshold is healthy. Records that wait while
    no micro-batch can finish (the first commit that writes results is frozen by SIGSTOP) turn
    /healthz to 503 with the lag in its reason."""
    settings = make_settings()
    ensure_topics(settings)
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    log, faults_log = tmp_path / "job.log", tmp_path / "faults.log"
    stall = 6.0  # metrics.stall_triggers x job.trigger_interval_seconds (1 s)
    http_timeout = 2.0
    env = {
        "IPCOUNT_HTTP_REQUEST_TIMEOUT_SECONDS": str(http_timeout),
        "IPCOUNT_METRICS_STALL_TRIGGERS": str(int(stall)),
        "IPCOUNT_METRICS_LAG_POLL_SECONDS": "1",
        # The first sink commit freezes its Python worker: no batch with results can finish.
        "IPCOUNT_FAULTS": ",".join(f"sink.before_commit@{b}/stop" for b in range(50)),
        "IPCOUNT_FAULTS_STATE": str(tmp_path),
        "IPCOUNT_FAULTS_LOG": str(faults_log),
    }
    job = _start_job(ipcount_env(settings, env), port, log)
    try:
        _wait(
            "/healthz 200",
            lambda: _get(base + "/healthz")[0] == 200,
            job,
            log,
            180,
        )
        # 2,000 half-open connections: /healthz answers within 1 s, the driver's threads stay
        # within the endpoint's bound (http.workers + 1 threads, already running), and the
        # server closes each within http.request_timeout_seconds.
        threads_before = _threads(job.pid)
        clients = _half_open(port, 2000)
        try:
            started = time.monotonic()
            status, body = _get(base + "/healthz")
            took = time.monotonic() - started
            threads_flooded = _threads(job.pid)
            print(
                f"driver threads {threads_before} -> {threads_flooded} under 2000 half-open; "
                f"/healthz {took * 1000:.0f} ms"
            )
            assert status == 200 and took < 1.0, (status, body, took)
            assert threads_flooded <= threads_before + 3, (threads_before, threads_flooded)
            late = _seconds_past(clients, http_timeout)
            assert max(late) < 1.0, max(late)
        finally:
            for sock, _ in clients:
                sock.close()

        # Idle for well over the stall threshold: healthy all along, lag known and 0.
        idle_until = time.monotonic() + stall + 6
        while time.monotonic() < idle_until:
            status, body = _get(base + "/healthz")
            assert status == 200 and body.startswith("ok"), body
            time.sleep(0.5)
        lags = _lags(_scrape(base))
        assert len(lags) == settings.topics.source_partitions, (lags, log.read_text()[-3000:])
        assert all(v == 0 for v in lags.values()), lags
        assert "source lag unknown" not in log.read_text()

        # The first batch with results freezes in its commit; then 200 more records arrive.
        feed = Feed(settings)
        feed.round(0, 4)
        _wait("the frozen commit", lambda: _pids_from(faults_log), job, log, 120)
        feed.round(4, 8)  # 200 records that no batch can take
        blocked_at = time.monotonic()
        status, body = _wait(
            "/healthz 503",
            lambda: (lambda r: r if r[0] == 503 else None)(_get(base + "/healthz")),
            job,
            log,
            stall + 30,
        )
        assert body.startswith("stalled:") and "while 200 records wait" in body, body
        assert time.monotonic() - blocked_at >= stall - 2, body
        assert sum(_lags(_scrape(base)).values()) == 200
    finally:
        for pid in _pids_from(faults_log):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGCONT)
        if job.poll() is None:
            job.send_signal(signal.SIGTERM)
            try:
                job.wait(120)
            except subprocess.TimeoutExpired:
                job.kill()
                job.wait(30)
