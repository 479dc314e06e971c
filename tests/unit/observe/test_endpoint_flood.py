"""The driver's endpoint under a flood of half-open connections (loopback only): /healthz still
answers at once, the threads stay within the documented bound, every connection is closed."""

from __future__ import annotations

import os
import resource
import selectors
import socket
import time
import urllib.request
from collections.abc import Iterator

import pytest

from ipcount.observe.endpoint import MetricsServer
from ipcount.observe.httpserve import HttpLimits
from ipcount.observe.metrics import JobMetrics

FLOOD = 2000
TIMEOUT = 2.0


def _threads() -> int:
    return len(os.listdir("/proc/self/task"))


@pytest.fixture
def enough_files() -> Iterator[None]:
    """Two descriptors per connection (client and server side) in this one process."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = 2 * FLOOD + 500
    if soft < want:
        if hard != resource.RLIM_INFINITY and hard < want:
            pytest.skip(f"ulimit -n hard limit {hard} is below {want}")
        resource.setrlimit(resource.RLIMIT_NOFILE, (want, hard))
    yield
    resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def _healthz(port: int) -> tuple[int, bytes, float]:
    started = time.monotonic()
    url = f"http://127.0.0.1:{port}/healthz"
    with urllib.request.urlopen(url, timeout=5) as resp:  # noqa: S310 - the test's own server
        return resp.status, resp.read(), time.monotonic() - started


def test_2000_half_open_connections_neither_block_healthz_nor_add_threads(
    enough_files: None,
) -> None:
    metrics = JobMetrics()
    metrics.started()
    before = _threads()
    limits = HttpLimits(request_timeout_seconds=TIMEOUT)
    server = MetricsServer(metrics, "127.0.0.1", 0, limits).start()
    clients: list[tuple[socket.socket, float]] = []
    try:
        serving = _threads()
        assert serving - before <= limits.workers + 1
        # Each client sends half a request and waits.
        for _ in range(FLOOD):
            sock = socket.create_connection(("127.0.0.1", server.port), timeout=5)
            sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n")
            clients.append((sock, time.monotonic()))
        status, body, took = _healthz(server.port)
        assert status == 200 and body.startswith(b"ok"), body
        assert took < 1.0, f"/healthz took {took:.3f}s under {FLOOD} half-open connections"
        flooded = _threads()
        print(
            f"threads: {before} before, {serving} serving, {flooded} with {FLOOD} half-open; "
            f"/healthz {took * 1000:.1f} ms"
        )
        assert flooded - before <= limits.workers + 1, (before, flooded)

        # Every connection is closed by the server, none later than the timeout after it opened
        # (the oldest beyond max_connections earlier, to make room); those closed while this
        # test was still opening others are seen closed as soon as it looks.
        sel = selectors.DefaultSelector()
        for sock, opened in clients:
            sock.setblocking(False)
            sel.register(sock, selectors.EVENT_READ, opened)
        watching = time.monotonic()
        late: list[float] = []  # seconds past its bound that each connection closed
        deadline = time.monotonic() + TIMEOUT + 10
        while sel.get_map() and time.monotonic() < deadline:
            for key, _ in sel.select(0.5):
                sock = key.fileobj
                assert isinstance(sock, socket.socket)
                try:
                    sock.recv(4096)  # a 408/503 answer, EOF or a reset: the server closes it
                except BlockingIOError:
                    continue
                except OSError:
                    pass
                bound = max(key.data + TIMEOUT, watching)
                late.append(time.monotonic() - bound)
                sel.unregister(sock)
        assert not sel.get_map(), f"{len(sel.get_map())} connections still open"
        assert len(late) == FLOOD
        assert max(late) < 1.0, max(late)
        assert _threads() - before <= limits.workers + 1
        status, _, took = _healthz(server.port)
        assert status == 200 and took < 1.0
    finally:
        for sock, _ in clients:
            sock.close()
        server.stop()
