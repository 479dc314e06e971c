"""`loadgen serve`: a small shop website (aiohttp) that writes one nginx combined-format access
record per answered request to the source topic. Runs in the loadgen process.
"""

from __future__ import annotations

import asyncio
import html
import json
import logging
import re
import signal
import time
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from aiohttp import web
from prometheus_client import CollectorRegistry
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.exposition import choose_encoder

from ipcount.config import Settings
from ipcount.formats.accesslog import (
    IP_PATTERN,
    ParseError,
    canonical_ip,
    format_record,
    parse_record,
)
from ipcount.verify.ledger import Ledger
from loadgen.producer import BackgroundSender, check_source_topic, producer_config

__all__ = ["PRODUCTS", "STATIC", "UNLOGGED_PATHS", "ServeResult", "build_app", "client_ip", "serve"]

logger = logging.getLogger(__name__)

_IP_RE = re.compile(IP_PATTERN)
# Operator endpoints, like a health check nginx keeps out of its access log.
UNLOGGED_PATHS = frozenset({"/_stats", "/metrics"})

_ADJECTIVES = ("Blue", "Red", "Trail", "Urban", "Classic", "Light", "Warm", "Rapid")
_NOUNS = ("Shoes", "Jacket", "Backpack", "Cap", "Socks", "Gloves", "Scarf", "Bottle", "Tent")
PRODUCTS: dict[int, tuple[str, int]] = {
    i + 1: (f"{_ADJECTIVES[i % len(_ADJECTIVES)]} {_NOUNS[i % len(_NOUNS)]} {i + 1}", 990 + 37 * i)
    for i in range(200)
}
STATIC: dict[str, tuple[str, bytes]] = {
    "css/site.css": ("text/css", b"body{font-family:sans-serif;margin:2em}" * 40),
    "js/app.js": ("application/javascript", b"document.addEventListener('click',()=>{});\n" * 60),
    "img/logo.png": ("image/png", b"\x89PNG\r\n\x1a\n" + bytes(range(256)) * 12),
    "favicon.ico": ("image/x-icon", bytes(318)),
}
_STATS_KEY = web.AppKey("loadgen_stats", dict[str, int])
_SENDER_KEY = web.AppKey("loadgen_sender", object)
_REGISTRY_KEY = web.AppKey("loadgen_registry", CollectorRegistry)


def _page(title: str, body: str) -> str:
    return (
        f"<!doctype html><html><head><title>{html.escape(title)} - Example Shop</title>"
        '<link rel="stylesheet" href="/static/css/site.css"></head>'
        f'<body><header><a href="/">Example Shop</a> | <a href="/products">Products</a></header>'
        f"<h1>{html.escape(title)}</h1>{body}"
        '<script src="/static/js/app.js"></script></body></html>'
    )


async def _home(request: web.Request) -> web.Response:
    featured = "".join(
        f'<li><a href="/products/{i}">{html.escape(PRODUCTS[i][0])}</a></li>' for i in (1, 7, 42)
    )
    body = (
        f'<form action="/search"><input name="q"><button>Search</button></form><ul>{featured}</ul>'
    )
    return web.Response(text=_page("Welcome", body), content_type="text/html")


async def _products(request: web.Request) -> web.Response:
    try:
        page = max(1, int(request.query.get("page", "1")))
    except ValueError:
        raise web.HTTPBadRequest(text="page must be a number") from None
    ids = list(PRODUCTS)[(page - 1) * 24 : page * 24]
    items = "".join(
        f'<li><a href="/products/{i}">{html.escape(PRODUCTS[i][0])}</a> '
        f"{PRODUCTS[i][1] / 100:.2f} EUR</li>"
        for i in ids
    )
    return web.Response(
        text=_page(f"Products, page {page}", f"<ul>{items}</ul>"), content_type="text/html"
    )


async def _product(request: web.Request) -> web.Response:
    try:
        pid = int(request.match_info["id"])
        name, price = PRODUCTS[pid]
    except (ValueError, KeyError):
        raise web.HTTPNotFound() from None
    body = (
        f"<p>{price / 100:.2f} EUR</p>"
        f'<form method="post" action="/cart"><input type="hidden" name="product_id" value="{pid}">'
        '<input name="qty" value="1"><button>Add to cart</button></form>'
    )
    return web.Response(text=_page(name, body), content_type="text/html")


async def _add_to_cart(request: web.Request) -> web.Response:
    if request.content_type == "application/json":
        try:
            data: Any = await request.json()
        except ValueError:
            raise web.HTTPBadRequest(text="body is not JSON") from None
    else:
        data = await request.post()
    try:
        pid = int(data.get("product_id", ""))
        qty = int(data.get("qty", "1"))
    except (TypeError, ValueError, AttributeError):
        raise web.HTTPBadRequest(text="product_id and qty must be numbers") from None
    if pid not in PRODUCTS or not 1 <= qty <= 99:
        raise web.HTTPBadRequest(text="unknown product or qty outside 1..99")
    return web.json_response({"added": pid, "qty": qty, "name": PRODUCTS[pid][0]}, status=201)


async def _search(request: web.Request) -> web.Response:
    q = request.query.get("q", "").strip()
    words = q.lower().split()
    hits = [
        i for i, (name, _) in PRODUCTS.items() if words and all(w in name.lower() for w in words)
    ]
    items = "".join(
        f'<li><a href="/products/{i}">{html.escape(PRODUCTS[i][0])}</a></li>' for i in hits[:20]
    )
    body = f"<p>{len(hits)} results for {html.escape(q)!s}</p><ul>{items}</ul>"
    return web.Response(text=_page("Search", body), content_type="text/html")


async def _static(request: web.Request) -> web.Response:
    entry = STATIC.get(request.match_info["path"])
    if entry is None:
        raise web.HTTPNotFound()
    ctype, data = entry
    return web.Response(body=data, content_type=ctype, headers={"Cache-Control": "max-age=3600"})


async def _stats(request: web.Request) -> web.Response:
    return web.json_response(_snapshot(request.app))


class _ServiceCollector:
    """The service's figures for prometheus_client, read from its stats at scrape time."""

    def __init__(self, app: web.Application) -> None:
        self._app = app

    def collect(self) -> Iterator[Any]:
        snap = _snapshot(self._app)
        yield CounterMetricFamily(
            "loadgen_requests", "Requests answered (each one an access record)", snap["requests"]
        )
        yield CounterMetricFamily(
            "loadgen_records_malformed",
            "Access records the job rejects as malformed (not a combined-format line)",
            snap["malformed"],
        )
        producer = snap["producer"]
        for key, text in _PRODUCER_FIGURES.items():
            yield CounterMetricFamily(f"loadgen_records_{key}", text, producer.get(key, 0))
        yield GaugeMetricFamily(
            "loadgen_backlog", "Records waiting for the background sender", snap["backlog"]
        )
        yield CounterMetricFamily(
            "loadgen_ledger_saves", "Times the ground-truth ledger was saved", snap["ledger_saves"]
        )


_PRODUCER_FIGURES = {
    "produced": "Records handed to the Kafka producer",
    "delivered": "Records the broker acknowledged",
    "failed": "Records whose delivery failed",
    "backpressure": "Times the producer queue was full and the sender waited",
    "dropped": "Records dropped (not sent)",
}


async def _metrics(request: web.Request) -> web.Response:
    encoder, content_type = choose_encoder(request.headers.get("Accept", ""))
    body = encoder(request.app[_REGISTRY_KEY])
    return web.Response(body=body, headers={"Content-Type": content_type})


def _snapshot(app: web.Application) -> dict[str, Any]:
    stats = app[_STATS_KEY]
    sender = app[_SENDER_KEY]
    producer = getattr(sender, "stats", None)
    ledger = getattr(sender, "ledger", None)
    return {
        "requests": stats["requests"],
        "malformed": stats["malformed"],
        "producer": producer.as_dict() if producer is not None else {},
        "backlog": getattr(sender, "backlog", 0),
        "ledger_on_time": ledger.on_time if ledger is not None else 0,
        "ledger_saves": getattr(sender, "saves", 0),
    }


def client_ip(forwarded_for: str | None, peer: str | None) -> str:
    """The client IP, canonical (as the job counts it): the first X-Forwarded-For hop when it is a
    valid IP, else the peer address."""
    if forwarded_for:
        first = forwarded_for.split(",", 1)[0].strip()
        if _IP_RE.match(first):
            return canonical_ip(first)
    if peer and _IP_RE.match(peer):
        return canonical_ip(peer)
    return (peer or "-").lower()


def _error_response(exc: web.HTTPException) -> web.Response:
    if exc.status == 404:
        text = _page("Not found", "<p>Sorry, that page does not exist.</p>")
        return web.Response(status=404, text=text, content_type="text/html")
    resp = web.Response(status=exc.status, reason=exc.reason, text=exc.text or exc.reason)
    if "Allow" in exc.headers:
        resp.headers["Allow"] = exc.headers["Allow"]
    return resp


Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def _access_log_middleware(sender: Any, stats: dict[str, int]) -> Any:
    @web.middleware
    async def access_log(request: web.Request, handler: Handler) -> web.StreamResponse:
        started = time.time()
        try:
            resp: web.StreamResponse = await handler(request)
        except web.HTTPException as exc:
            resp = _error_response(exc)
        except Exception:
            logger.exception("handler failed for %s %s", request.method, request.path)
            resp = web.Response(status=500, text="internal error")
        if request.path in UNLOGGED_PATHS:
            return resp
        body = getattr(resp, "body", None)
        size = len(body) if isinstance(body, bytes | bytearray) else (resp.content_length or 0)
        ip = client_ip(request.headers.get("X-Forwarded-For"), request.remote)
        event_ms = int(started) * 1000  # nginx $time_local has second precision
        line = format_record(
            ip, event_ms, method=request.method, path=request.raw_path,
            protocol=f"HTTP/{request.version.major}.{request.version.minor}",
            status=resp.status, body_bytes=size,
            referer=request.headers.get("Referer", "-"),
            user_agent=request.headers.get("User-Agent", "-"),
        )  # fmt: skip
        value = line.encode("utf-8")
        # The ledger follows the job's rules: a line it would reject is counted as malformed
        # (whatever its length: the job counts every line nginx writes).
        try:
            parse_record(line)
            malformed = False
        except ParseError:
            malformed = True
        stats["requests"] += 1
        stats["malformed"] += malformed
        if sender is not None:
            sender.submit(value, ip.encode("utf-8"), event_ms, malformed=malformed)
        return resp

    return access_log


def build_app(sender: BackgroundSender | None) -> web.Application:
    """The website; with a sender, each answered request (but /_stats, /metrics) is a record, of
    any length (the job counts every line nginx writes)."""
    stats = {"requests": 0, "malformed": 0}
    app = web.Application(middlewares=[_access_log_middleware(sender, stats)])
    app[_STATS_KEY] = stats
    app[_SENDER_KEY] = sender
    # One registry per app (not prometheus_client's global one): apps in one process stay apart.
    registry = CollectorRegistry()
    registry.register(_ServiceCollector(app))  # type: ignore[arg-type]
    app[_REGISTRY_KEY] = registry
    app.router.add_get("/", _home)
    app.router.add_get("/products", _products)
    app.router.add_get(r"/products/{id}", _product)
    app.router.add_post("/cart", _add_to_cart)
    app.router.add_get("/search", _search)
    app.router.add_get(r"/static/{path:.+}", _static)
    app.router.add_get("/_stats", _stats)
    app.router.add_get("/metrics", _metrics)
    return app


@dataclass
class ServeResult:
    """What one service run answered and delivered."""

    requests: int
    malformed: int
    delivered: int
    errors: int
    dropped: int
    backpressure: int
    unreported: int
    seconds: float

    @property
    def ok(self) -> bool:
        return not (self.errors or self.dropped or self.unreported)

    def summary(self) -> str:
        return (
            f"serve: requests={self.requests} records={self.delivered} malformed={self.malformed} "
            f"errors={self.errors} dropped={self.dropped} unreported={self.unreported} "
            f"backpressure={self.backpressure} seconds={self.seconds:.1f}"
        )


async def _serve(
    settings: Settings,
    sender: BackgroundSender,
    host: str,
    port: int,
    on_ready: Callable[[str], None],
) -> dict[str, int]:
    app = build_app(sender)
    runner = web.AppRunner(app, access_log=None, handle_signals=False)
    await runner.setup()
    site = web.TCPSite(runner, host, port)
    await site.start()
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    bound = runner.addresses[0]
    shown = f"[{bound[0]}]" if ":" in str(bound[0]) else bound[0]
    on_ready(f"http://{shown}:{bound[1]}")
    try:
        await stop.wait()
    finally:
        logger.info("shutting down: finishing in-flight requests")
        await runner.cleanup()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.remove_signal_handler(sig)
    return app[_STATS_KEY].copy()


def serve(
    settings: Settings,
    *,
    host: str = "127.0.0.1",
    port: int = 8080,
    ledger_path: str | Path | None = None,
    save_interval: float = 5.0,
    on_ready: Callable[[str], None] = print,
) -> ServeResult:
    """Run the website until SIGINT/SIGTERM, then flush the producer and write the ledger.

    Raises:
        ConfigError: a missing source topic.
        BrokerError: no broker answers.
    """
    check_source_topic(settings)
    ledger = Ledger(window_ms=int(settings.job.window_seconds * 1000))
    sender = BackgroundSender(
        producer_config(settings), settings.topics.source, ledger,
        ledger_path=ledger_path, save_interval=save_interval,
    )  # fmt: skip
    sender.start()
    t0 = time.monotonic()
    try:
        counters = asyncio.run(_serve(settings, sender, host, port, on_ready))
    finally:
        unreported = sender.close()
    logger.info(
        "ledger: %s", json.dumps({"on_time": ledger.on_time, "malformed": ledger.malformed})
    )
    s = sender.stats
    return ServeResult(
        requests=counters["requests"],
        malformed=counters["malformed"],
        delivered=s.delivered,
        errors=s.failed,
        dropped=s.dropped,
        backpressure=s.backpressure,
        unreported=unreported,
        seconds=time.monotonic() - t0,
    )
