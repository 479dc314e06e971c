"""`loadgen serve` as a subprocess against the test broker: N answered requests become N records
with the right client IPs, the ledger matches the topic, SIGTERM flushes and saves."""

from __future__ import annotations

import http.client
import json
import subprocess
import time
from collections import Counter
from pathlib import Path
from urllib.parse import urlsplit

from test_bench_support import (
    clean_env,
    count_like_the_job,
    loadgen_cmd,
    read_topic,
    start_service,
    stop_service,
)

from ipcount.config import Settings
from ipcount.formats.accesslog import parse_record
from ipcount.kafka.topics import ensure_topics
from ipcount.verify.ledger import Ledger

# (method, path, X-Forwarded-For or None, body, expected client IP, expected status)
CASES: list[tuple[str, str, str | None, str | None, str, int]] = [
    ("GET", "/", None, None, "127.0.0.1", 200),
    ("GET", "/products", "203.0.113.10", None, "203.0.113.10", 200),
    ("GET", "/products/7", "203.0.113.10, 10.0.0.1", None, "203.0.113.10", 200),
    ("GET", "/products/12345", "198.51.100.2", None, "198.51.100.2", 404),
    # Canonical (RFC 5952): the first of the two longest zero runs becomes "::".
    ("GET", "/search?q=trail+cap", "2001:DB8:0:0:1::5", None, "2001:db8::1:0:0:5", 200),
    ("POST", "/cart", "2001:db8::42", "product_id=9&qty=1", "2001:db8::42", 201),
    ("GET", "/static/js/app.js", "unknown", None, "127.0.0.1", 200),
    ("GET", "/static/missing.css", "999.1.1.1", None, "127.0.0.1", 404),
    ("GET", "/nothing-here", "", None, "127.0.0.1", 404),
    ("GET", "/cart", "192.0.2.1", None, "192.0.2.1", 405),
]
ROUNDS = 15


def _request(conn: http.client.HTTPConnection, case: tuple) -> tuple[int, int]:
    method, path, xff, body, _, _ = case
    headers = {"User-Agent": "loadgen-test/1.0"}
    if xff is not None:
        headers["X-Forwarded-For"] = xff
    if body is not None:
        headers["Content-Type"] = "application/x-www-form-urlencoded"
    conn.request(method, path, body=body, headers=headers)
    resp = conn.getresponse()
    return resp.status, len(resp.read())


def test_requests_become_records(settings: Settings, tmp_path: Path) -> None:
    ensure_topics(settings)
    ledger_file = tmp_path / "serve.jsonl"
    proc, url = start_service(
        [*loadgen_cmd(settings), "serve", "--port", "0", "--ledger", str(ledger_file),
         "--ledger-interval", "1"]
    )  # fmt: skip
    expected: Counter[tuple[str, str, int, int]] = Counter()
    try:
        host = urlsplit(url)
        conn = http.client.HTTPConnection(host.hostname, host.port, timeout=10)
        t0 = int(time.time()) * 1000
        for _ in range(ROUNDS):
            for case in CASES:
                status, size = _request(conn, case)
                assert status == case[5], case
                expected[(case[4], f"{case[0]} {case[1]} HTTP/1.1", status, size)] += 1
        t1 = int(time.time()) * 1000
        n = ROUNDS * len(CASES)
        # The stats endpoint (not logged itself) sees every record delivered.
        deadline = time.monotonic() + 15
        while True:
            conn.request("GET", "/_stats")
            stats = json.loads(conn.getresponse().read())
            if stats["producer"]["delivered"] == n or time.monotonic() > deadline:
                break
            time.sleep(0.2)
        assert stats["requests"] == n
        assert stats["producer"]["delivered"] == n and stats["producer"]["failed"] == 0
        assert stats["backlog"] == 0
        time.sleep(1.5)
        assert Ledger.load(ledger_file).on_time == n  # the periodic write, before shutdown
        conn.close()
    finally:
        rc, out, err = stop_service(proc)
    assert rc == 0, err
    assert f"records={n} " in out and "errors=0" in out, out

    records = read_topic(settings)
    assert len(records) == n
    got: Counter[tuple[str, str, int, int]] = Counter()
    for key, value, ts, _ in records:
        rec = parse_record(value)
        assert key == rec.ip.encode() and ts == rec.event_ms and t0 <= ts <= t1
        assert rec.user_agent == "loadgen-test/1.0"
        got[(rec.ip, rec.request, rec.status, rec.body_bytes)] += 1
    assert got == expected

    ledger = Ledger.load(ledger_file)
    topic = count_like_the_job(records, settings.job.max_record_bytes)
    assert ledger.counts == topic.counts and ledger.on_time == n and ledger.malformed == 0


def test_serve_refuses_a_missing_topic(settings: Settings) -> None:
    proc = subprocess.run(
        [*loadgen_cmd(settings), "serve", "--port", "0"],
        capture_output=True, text=True, env=clean_env(), timeout=60,
    )  # fmt: skip
    assert proc.returncode == 1
    assert "ipcount topics create" in proc.stderr and "Traceback" not in proc.stderr
