"""`ipcount dashboard`'s web server (ipcount.observe.httpserve): the page, its static files, and
the JSON it polls (/api/top, /api/health), for requests whose Host names this server; a
background thread keeps the top-N current. CLI side."""

from __future__ import annotations

import http.server
import importlib.resources
import json
import logging
import threading
import time
import urllib.parse
from typing import Any

from ipcount.config import Settings
from ipcount.dashboard.feed import ResultFeed
from ipcount.dashboard.model import TopWindow, WindowBook
from ipcount.dashboard.scrape import MetricsPoller
from ipcount.errors import BrokerError, IpcountError
from ipcount.observe.hosts import host_allowed, host_port
from ipcount.observe.httpserve import HttpLimits, HttpServer

__all__ = ["LiveTop", "DashboardServer", "MAX_N"]

logger = logging.getLogger(__name__)

MAX_N = 100  # the most IPs per window the data endpoint gives
_STATIC = {
    "index.html": "text/html; charset=utf-8",
    "app.js": "text/javascript; charset=utf-8",
    "style.css": "text/css; charset=utf-8",
}
_RETRY_SECONDS = 1.0
_HEALTH_CACHE_SECONDS = 0.5


class LiveTop:
    """Follows the sink and late topics in a background thread and publishes, each time it has
    caught up, every kept window's top MAX_N (the top n of a request is a prefix of it)."""

    def __init__(self, settings: Settings, keep: int, with_late: bool = True) -> None:
        self.settings = settings
        self.with_late = with_late
        self.book = WindowBook(keep=keep)
        self._feed = ResultFeed(settings, with_late=with_late)
        self._lock = threading.Lock()
        self._published: dict[int, TopWindow] = {}
        self._published_seq = 0
        self._caught_up_at: float | None = None
        self._error: str | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="ipcount-live-top", daemon=True)

    def start(self) -> None:
        """Connect (in the caller's thread, so a missing topic or an unreachable broker is an
        error the command reports) and start following.

        Raises:
            BrokerError / ConfigError: from ResultFeed.open.
        """
        self._feed.open()
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(10)
        self._feed.close()

    def _publish(self) -> None:
        book = self.book
        changed = book.changed_since(self._published_seq)
        fresh = {s: w for s in changed if (w := book.window(s, MAX_N)) is not None}
        kept = set(book.starts())
        with self._lock:
            self._published = {
                s: fresh.get(s, w) for s, w in self._published.items() if s in kept
            } | fresh
            self._published_seq = book.seq
            self._caught_up_at = time.time()
            self._error = None

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                if self._feed.step(self.book):
                    self._publish()
            except BrokerError as exc:
                self._set_error(f"{exc} (retrying)")
                self._stop.wait(_RETRY_SECONDS)
            except IpcountError as exc:
                self._set_error(f"stopped reading: {exc}")
                logger.error("live top stopped: %s", exc)
                return
            except Exception as exc:  # keep serving the page: the error is shown there
                self._set_error(f"stopped reading: {type(exc).__name__}: {exc}")
                logger.exception("live top stopped")
                return

    def _set_error(self, message: str) -> None:
        if message != self._error:
            logger.warning("%s", message)
        with self._lock:
            self._error = message

    def snapshot(self, n: int) -> dict[str, Any]:
        """What /api/top answers: the kept windows in window order, each with its top n."""
        with self._lock:
            windows = [self._published[s] for s in sorted(self._published)]
            caught_up_at, error = self._caught_up_at, self._error
        topics = self.settings.topics
        return {
            "n": n,
            "windows": [_first(w.to_json(), n) for w in windows],
            "feed": {
                "sink": topics.sink,
                "late": topics.late if self.with_late else None,
                "isolation": "read_committed",
                "caught_up_at": caught_up_at,
                "error": error,
                "records": self._feed.records,
                "keep": self.book.keep,
                "forgotten": self.book.forgotten,
            },
        }


def _first(window: dict[str, Any], n: int) -> dict[str, Any]:
    window["top"] = window["top"][:n]
    return window


class DashboardServer(HttpServer):
    """The HTTP server; `live` and `metrics` are what its handlers read.

    It answers only requests whose Host header is localhost, a loopback address, `host` (unless
    a wildcard such as 0.0.0.0) or one of `allowed_hosts` ("*": any): a page on another site
    whose name was rebound to this address must not read the clients' IPs.
    """

    def __init__(
        self,
        host: str,
        port: int,
        live: LiveTop,
        metrics: MetricsPoller,
        *,
        limits: HttpLimits | None = None,
        allowed_hosts: tuple[str, ...] = (),
    ) -> None:
        self.live = live
        self.metrics = metrics
        bare = host.strip("[]")
        wildcard = bare in ("", "0.0.0.0", "::")  # noqa: S104 - compared, not bound
        self.allowed_hosts = allowed_hosts if wildcard else (bare, *allowed_hosts)
        self._health_lock = threading.Lock()
        self._health: tuple[float, dict[str, Any]] | None = None
        super().__init__(
            host, port, _Handler, host_option="--host", port_option="--port", limits=limits
        )

    @property
    def url(self) -> str:
        host, port = self.server_address[:2]
        return f"http://{host_port(str(host), port)}/"

    def health(self) -> dict[str, Any]:
        """The metrics endpoint's figures, read at most every half second."""
        with self._health_lock:
            now = time.monotonic()
            if self._health is None or now - self._health[0] > _HEALTH_CACHE_SECONDS:
                self._health = (now, self.metrics.read().to_json())
            return self._health[1]


class _Handler(http.server.BaseHTTPRequestHandler):
    server: DashboardServer

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - the stdlib's name
        logger.debug("%s %s", self.address_string(), format % args)

    def _send(self, status: int, body: bytes, ctype: str) -> None:
        self.send_response(status)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Cache-Control", "no-store")
        self.end_headers()
        self.wfile.write(body)

    def _json(self, status: int, obj: Any) -> None:
        self._send(status, json.dumps(obj).encode(), "application/json")

    def do_GET(self) -> None:  # noqa: N802 - http.server's hook name
        host = self.headers.get("Host")
        if not host_allowed(host, self.server.allowed_hosts):
            logger.debug("refused a request for Host %r from %s", host, self.address_string())
            self._send(
                403,
                f"Host {host!r} is not this dashboard's name: open it as http://localhost:PORT/ "
                "or allow the name with --allow-host NAME (or http.allowed_hosts)\n".encode(),
                "text/plain; charset=utf-8",
            )
            return
        url = urllib.parse.urlsplit(self.path)
        path = url.path
        if path == "/api/top":
            query = urllib.parse.parse_qs(url.query)
            try:
                n = int(query.get("n", ["10"])[0])
            except ValueError:
                n = 0
            if not 1 <= n <= MAX_N:
                self._json(400, {"error": f"n must be a whole number from 1 to {MAX_N}"})
                return
            self._json(200, self.server.live.snapshot(n))
        elif path == "/api/health":
            self._json(200, self.server.health())
        elif path in ("/", "/index.html") or path.startswith("/static/"):
            name = "index.html" if path in ("/", "/index.html") else path.removeprefix("/static/")
            if name not in _STATIC:
                self._send(404, b"not found\n", "text/plain")
                return
            body = (importlib.resources.files("ipcount.dashboard") / "static" / name).read_bytes()
            self._send(200, body, _STATIC[name])
        else:
            self._send(404, b"not found\n", "text/plain")
