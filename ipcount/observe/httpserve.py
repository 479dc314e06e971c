"""The HTTP server the driver's /metrics and `ipcount dashboard` listen with (driver / CLI): IPv4
or IPv6 hosts, bind failures as ConfigErrors naming the option, and limits a flood of slow or
half-open clients cannot break: one selector thread reads request heads, a few workers answer."""

from __future__ import annotations

import contextlib
import io
import logging
import queue
import selectors
import socket
import sys
import threading
import time
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, HTTPServer
from typing import Any, Protocol

from ipcount.errors import ConfigError
from ipcount.observe.hosts import address_family, bind_hint, host_port

__all__ = ["HttpServer", "HttpLimits", "http_limits"]

logger = logging.getLogger(__name__)

_WAKE = "wake"
_HEAD_ENDS = (b"\r\n\r\n", b"\n\n")


@dataclass(frozen=True)
class HttpLimits:
    """What one client may hold (settings [http]).

    Attributes:
        request_timeout_seconds: from accept until the request head (request line and headers)
            is in; the connection is closed after it. Also the bound on writing one response.
        max_connections: connections held at once (sending their request, waiting for or being
            answered). A new one beyond it closes the oldest still sending its request; when
            every held one is being answered, the new one is closed at once.
        workers: threads that answer complete requests (the server's only other thread is the
            one that accepts and reads request heads).
        max_head_bytes: a request head longer than this is answered 431 and closed.
    """

    request_timeout_seconds: float = 5.0
    max_connections: int = 256
    workers: int = 4
    max_head_bytes: int = 64 * 1024


class _HttpSection(Protocol):
    @property
    def request_timeout_seconds(self) -> float: ...
    @property
    def max_connections(self) -> int: ...
    @property
    def workers(self) -> int: ...


def http_limits(section: _HttpSection) -> HttpLimits:
    """The limits of the settings' [http] section (`settings.http`)."""
    return HttpLimits(section.request_timeout_seconds, section.max_connections, section.workers)


class _Replay(io.RawIOBase):
    """A connection's input: the request head the selector thread already read, then the
    socket (for a body, which the handlers here never expect)."""

    def __init__(self, head: bytes, sock: socket.socket) -> None:
        self._head = memoryview(head)
        self._sock = sock

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        if len(self._head):
            n = min(len(buffer), len(self._head))
            buffer[:n] = self._head[:n]
            self._head = self._head[n:]
            return n
        return self._sock.recv_into(buffer)


class _ReplayHead(BaseHTTPRequestHandler):
    """Mixed in before the server's handler: it reads the head the selector thread read."""

    server: HttpServer

    def setup(self) -> None:
        super().setup()
        self.rfile.close()
        self.rfile = io.BufferedReader(_Replay(self.server._head(), self.connection))


class _Pending:
    __slots__ = ("addr", "buf", "deadline")

    def __init__(self, addr: Any, deadline: float) -> None:
        self.addr = addr
        self.buf = bytearray()
        self.deadline = deadline


class HttpServer(HTTPServer):
    """An HTTP server on an IPv4 or IPv6 host (`::` also takes IPv4 connections where the system
    allows it, as 0.0.0.0 does for IPv4) with the bounds of `limits`: whatever clients do, it
    runs 1 + `limits.workers` threads and holds at most `limits.max_connections` connections,
    each for at most `limits.request_timeout_seconds` before its request is complete.

    Raises:
        ConfigError: the host does not resolve or the address cannot be bound; the message names
            `host_option` or `port_option` by the cause.
    """

    request_queue_size = 128  # the kernel's accept backlog; the selector empties it quickly

    def __init__(
        self,
        host: str,
        port: int,
        handler: type[BaseHTTPRequestHandler],
        *,
        host_option: str,
        port_option: str,
        limits: HttpLimits | None = None,
    ) -> None:
        self.limits = limits or HttpLimits()
        self._stop = threading.Event()
        self._done = threading.Event()
        self._done.set()
        self._ready: queue.SimpleQueue[tuple[socket.socket, Any, bytes] | None] = (
            queue.SimpleQueue()
        )
        self._busy = 0
        self._busy_lock = threading.Lock()
        self._local = threading.local()
        self._wake_r, self._wake_w = socket.socketpair()
        self._wake_r.setblocking(False)
        self._wake_w.setblocking(False)
        replay = type(handler.__name__, (_ReplayHead, handler), {})
        bare = host.strip("[]")
        try:
            self.address_family = address_family(bare)
            super().__init__((bare, port), replay)
        except OSError as exc:
            self._close_wake()
            hint = bind_hint(exc, bare, host_option, port_option)
            raise ConfigError(
                f"cannot listen on {host_port(bare, port)}: {exc.strerror or exc}; {hint}"
            ) from exc

    def server_bind(self) -> None:
        if self.address_family == socket.AF_INET6 and self.server_address[0] == "::":
            # Dual stack, as `python -m http.server --bind ::` does: a probe of 127.0.0.1 works.
            with contextlib.suppress(AttributeError, OSError):
                self.socket.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
        super().server_bind()

    # --- the loop ------------------------------------------------------------------------------

    def serve_forever(self, poll_interval: float = 0.5) -> None:
        """Accept and read request heads in this thread; answer them in the worker threads;
        return after `shutdown()`."""
        self._done.clear()
        name = threading.current_thread().name
        pool = [
            threading.Thread(target=self._work, name=f"{name}-worker-{i}", daemon=True)
            for i in range(max(1, self.limits.workers))
        ]
        for thread in pool:
            thread.start()
        sel = selectors.DefaultSelector()
        pending: dict[socket.socket, _Pending] = {}  # oldest first
        try:
            self.socket.setblocking(False)
            sel.register(self.socket, selectors.EVENT_READ, None)
            sel.register(self._wake_r, selectors.EVENT_READ, _WAKE)
            while not self._stop.is_set():
                timeout = poll_interval
                if pending:
                    first = next(iter(pending.values()))
                    timeout = min(timeout, max(0.0, first.deadline - time.monotonic()))
                for key, _ in sel.select(timeout):
                    if key.data is None:
                        self._accept(sel, pending)
                    elif key.data == _WAKE:
                        with contextlib.suppress(OSError):
                            self._wake_r.recv(4096)
                    else:
                        self._read(sel, pending, key.fileobj)  # type: ignore[arg-type]
                self._expire(sel, pending)
        finally:
            for conn in list(pending):
                self._drop(sel, pending, conn, b"")
            sel.close()
            for _ in pool:
                self._ready.put(None)
            for thread in pool:
                thread.join(self.limits.request_timeout_seconds + 1)
            self._stop.clear()
            self._done.set()

    def shutdown(self) -> None:
        """Stop serve_forever and wait until it has returned (call from another thread)."""
        self._stop.set()
        with contextlib.suppress(OSError):
            self._wake_w.send(b"x")
        self._done.wait()

    def server_close(self) -> None:
        super().server_close()
        self._close_wake()

    def _close_wake(self) -> None:
        self._wake_r.close()
        self._wake_w.close()

    def _held(self, pending: dict[socket.socket, _Pending]) -> int:
        with self._busy_lock:
            return len(pending) + self._busy

    def _accept(self, sel: selectors.BaseSelector, pending: dict[socket.socket, _Pending]) -> None:
        for _ in range(self.request_queue_size):
            try:
                conn, addr = self.socket.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as exc:  # e.g. EMFILE: the backlog waits for the next round
                logger.warning("HTTP accept on %s failed: %s", self.server_address, exc)
                return
            conn.setblocking(False)
            if self._held(pending) >= self.limits.max_connections:
                if not pending:  # every held connection is being answered: refuse this one
                    _answer_and_close(conn, b"503 Service Unavailable")
                    continue
                oldest = next(iter(pending))
                logger.debug("HTTP connection limit: closing the oldest unfinished request")
                self._drop(sel, pending, oldest, b"503 Service Unavailable")
            pending[conn] = _Pending(addr, time.monotonic() + self.limits.request_timeout_seconds)
            sel.register(conn, selectors.EVENT_READ, addr)

    def _read(
        self,
        sel: selectors.BaseSelector,
        pending: dict[socket.socket, _Pending],
        conn: socket.socket,
    ) -> None:
        state = pending[conn]
        try:
            data = conn.recv(8192)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            data = b""
        if not data:  # the client left before its request was complete
            self._drop(sel, pending, conn, b"")
            return
        state.buf += data
        if any(end in state.buf for end in _HEAD_ENDS):
            sel.unregister(conn)
            del pending[conn]
            with self._busy_lock:
                self._busy += 1
            self._ready.put((conn, state.addr, bytes(state.buf)))
        elif len(state.buf) > self.limits.max_head_bytes:
            self._drop(sel, pending, conn, b"431 Request Header Fields Too Large")

    def _expire(self, sel: selectors.BaseSelector, pending: dict[socket.socket, _Pending]) -> None:
        now = time.monotonic()
        while pending:
            conn, state = next(iter(pending.items()))
            if state.deadline > now:
                return
            logger.debug("HTTP client %s sent no complete request in time", state.addr)
            self._drop(sel, pending, conn, b"408 Request Timeout")

    def _drop(
        self,
        sel: selectors.BaseSelector,
        pending: dict[socket.socket, _Pending],
        conn: socket.socket,
        status: bytes,
    ) -> None:
        pending.pop(conn, None)
        with contextlib.suppress(KeyError, ValueError):
            sel.unregister(conn)
        _answer_and_close(conn, status)

    # --- the workers ---------------------------------------------------------------------------

    def _work(self) -> None:
        while (item := self._ready.get()) is not None:
            conn, addr, head = item
            try:
                conn.setblocking(True)
                conn.settimeout(self.limits.request_timeout_seconds)
                self._local.head = head
                self.finish_request(conn, addr)
            except Exception:
                self.handle_error(conn, addr)
            finally:
                self._local.head = b""
                self.shutdown_request(conn)
                with self._busy_lock:
                    self._busy -= 1

    def _head(self) -> bytes:
        return bytes(getattr(self._local, "head", b""))

    def handle_error(self, request: Any, client_address: Any) -> None:
        """A client that leaves early (broken pipe, reset, timeout) is routine: debug, no
        traceback. Anything else is a bug in a handler: a warning with its traceback."""
        exc = sys.exc_info()[1]
        if isinstance(exc, (ConnectionError, TimeoutError)):
            logger.debug("HTTP client %s went away: %s", client_address, exc)
        else:
            logger.warning("HTTP request from %s failed", client_address, exc_info=True)


def _answer_and_close(conn: socket.socket, status: bytes) -> None:
    """A short final answer if the socket takes it at once, then close."""
    if status:
        with contextlib.suppress(OSError):
            conn.send(b"HTTP/1.0 " + status + b"\r\nConnection: close\r\nContent-Length: 0\r\n\r\n")
    with contextlib.suppress(OSError):
        conn.close()
