"""The website's pages and its access-log middleware, with an injected fake sender (no Kafka)."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest
from aiohttp.test_utils import TestClient, TestServer
from prometheus_client.parser import text_string_to_metric_families

from ipcount.formats.accesslog import parse_record
from loadgen.service import build_app, client_ip


class FakeSender:
    """Collects what the service would hand to Kafka."""

    def __init__(self) -> None:
        self.records: list[tuple[bytes, bytes | None, int, bool]] = []

    def submit(self, value: bytes, key: bytes | None, ts: int, *, malformed: bool = False) -> None:
        self.records.append((value, key, ts, malformed))


@pytest.mark.parametrize(
    ("header", "peer", "expected"),
    [
        (None, "127.0.0.1", "127.0.0.1"),
        ("203.0.113.7", "127.0.0.1", "203.0.113.7"),
        ("203.0.113.7, 10.0.0.1, 10.0.0.2", "127.0.0.1", "203.0.113.7"),
        (" 2001:DB8::7 ,10.0.0.1", "127.0.0.1", "2001:db8::7"),
        ("unknown", "127.0.0.1", "127.0.0.1"),
        ("999.1.1.1", "127.0.0.1", "127.0.0.1"),
        ("", "::1", "::1"),
        ("1.2.3.4:8080", "10.1.1.1", "10.1.1.1"),
    ],
)
def test_client_ip(header: str | None, peer: str, expected: str) -> None:
    assert client_ip(header, peer) == expected


REQUESTS: list[tuple[str, str, dict[str, str], Any, int]] = [
    ("GET", "/", {}, None, 200),
    ("GET", "/products?page=2", {"X-Forwarded-For": "198.51.100.4"}, None, 200),
    ("GET", "/products/42", {"Referer": "http://shop/products"}, None, 200),
    ("GET", "/products/9999", {}, None, 404),
    ("GET", "/products/abc", {}, None, 404),
    ("GET", "/search?q=blue+shoes", {"User-Agent": 'Agent "quoted"'}, None, 200),
    ("POST", "/cart", {}, {"product_id": "3", "qty": "2"}, 201),
    ("POST", "/cart", {}, {"product_id": "0"}, 400),
    ("GET", "/cart", {}, None, 405),
    ("GET", "/static/css/site.css", {"X-Forwarded-For": "2001:db8::1"}, None, 200),
    ("GET", "/static/none.js", {}, None, 404),
    ("GET", "/no/such/page", {}, None, 404),
]


def test_every_answered_request_becomes_one_record() -> None:
    sender = FakeSender()

    async def scenario() -> list[tuple[int, int]]:
        app = build_app(sender)  # type: ignore[arg-type]
        async with TestClient(TestServer(app)) as client:
            seen = []
            for method, path, headers, data, _status in REQUESTS:
                resp = await client.request(method, path, headers=headers, data=data)
                body = await resp.read()
                seen.append((resp.status, len(body)))
            # Operator endpoints are not logged.
            stats = await (await client.get("/_stats")).json()
            assert stats["requests"] == len(REQUESTS)
            assert (await client.get("/metrics")).status == 200
            return seen

    t0 = int(time.time()) * 1000
    seen = asyncio.run(scenario())
    t1 = int(time.time()) * 1000
    assert [s for s, _ in seen] == [r[4] for r in REQUESTS]
    assert len(sender.records) == len(REQUESTS)
    for (value, key, ts, malformed), req, (status, size) in zip(sender.records, REQUESTS, seen):
        method, path, headers, _data, _ = req
        rec = parse_record(value)
        assert not malformed
        assert rec.ip == headers.get("X-Forwarded-For", "127.0.0.1")
        assert key == rec.ip.encode()
        assert rec.request == f"{method} {path} HTTP/1.1"
        assert (rec.status, rec.body_bytes) == (status, size)
        assert rec.event_ms == ts and t0 <= ts <= t1
        assert rec.referer == headers.get("Referer", "-")
    assert parse_record(sender.records[5][0]).user_agent == 'Agent \\"quoted\\"'


def test_a_long_line_is_counted_like_any_other() -> None:
    sender = FakeSender()

    async def scenario() -> None:
        async with TestClient(TestServer(build_app(sender))) as client:  # type: ignore[arg-type]
            await (await client.get("/search?q=" + "x" * 400)).read()
            await (await client.get("/")).read()

    asyncio.run(scenario())
    # The job counts a line at any length (job.max_record_bytes is retired): not malformed.
    assert [m for *_, m in sender.records] == [False, False]


def test_metrics_are_prometheus_text() -> None:
    """/metrics is what Prometheus parses: typed families, the same figures as /_stats."""
    sender = FakeSender()

    async def scenario() -> tuple[str, str]:
        async with TestClient(TestServer(build_app(sender))) as client:  # type: ignore[arg-type]
            for path in ("/", "/products", "/search?q=" + "x" * 400):
                await (await client.get(path)).read()
            resp = await client.get("/metrics")
            return resp.headers["Content-Type"], await resp.text()

    content_type, text = asyncio.run(scenario())
    assert content_type.startswith("text/plain") and "version=0.0.4" in content_type
    families = {f.name: f for f in text_string_to_metric_families(text)}
    assert families["loadgen_requests"].type == "counter"
    values = {s.name: s.value for f in families.values() for s in f.samples}
    assert values["loadgen_requests_total"] == 3
    assert values["loadgen_records_malformed_total"] == 0
    assert values["loadgen_records_produced_total"] == 0  # a sender without producer stats
    assert families["loadgen_backlog"].type == "gauge" and values["loadgen_backlog"] == 0
    assert values["loadgen_ledger_saves_total"] == 0
