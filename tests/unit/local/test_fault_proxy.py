"""The TCP fault proxy, measured with real sockets against a local echo server: it forwards, and
each fault (latency, bandwidth, reset, blackhole) does what it says, then heals."""

from __future__ import annotations

import socket
import socketserver
import threading
import time
from collections.abc import Iterator

import pytest

from ipcount.local.fault_proxy import FaultProxy


class _Echo(socketserver.BaseRequestHandler):
    def handle(self) -> None:
        while data := self.request.recv(65536):
            self.request.sendall(data)


@pytest.fixture
def echo() -> Iterator[tuple[str, int]]:
    server = socketserver.ThreadingTCPServer(("127.0.0.1", 0), _Echo)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield server.server_address[0], server.server_address[1]
    finally:
        server.shutdown()
        server.server_close()


@pytest.fixture
def proxy(echo: tuple[str, int]) -> Iterator[FaultProxy]:
    with FaultProxy(*echo) as p:
        yield p


def _connect(proxy: FaultProxy, timeout: float = 5.0) -> socket.socket:
    return socket.create_connection(("127.0.0.1", proxy.port), timeout=timeout)


def _echo_time(sock: socket.socket, payload: bytes) -> float:
    """Seconds until `payload` came back whole."""
    t0 = time.monotonic()
    sock.sendall(payload)
    got = b""
    while len(got) < len(payload):
        chunk = sock.recv(65536)
        assert chunk, f"connection closed after {len(got)} of {len(payload)} bytes"
        got += chunk
    assert got == payload
    return time.monotonic() - t0


def test_forwards_both_ways_and_counts(proxy: FaultProxy) -> None:
    with _connect(proxy) as sock:
        assert _echo_time(sock, b"hello" * 1000) < 10.0
        figures = proxy.figures()
    assert figures.bytes_up == figures.bytes_down == 5000
    assert figures.accepted == 1


def test_latency_delays_each_direction(proxy: FaultProxy) -> None:
    with _connect(proxy) as sock:
        before = _echo_time(sock, b"ping")
        proxy.set_latency(150)
        slow = _echo_time(sock, b"ping")
        proxy.heal()
        after = _echo_time(sock, b"ping")
    assert before < 2.0 and after < min(2.0, slow), (before, after, slow)
    assert 0.3 <= slow < 10.0, slow  # 150 ms up + 150 ms down


@pytest.mark.slow
def test_bandwidth_caps_the_rate(proxy: FaultProxy) -> None:
    proxy.set_bandwidth(20_000)
    with _connect(proxy, timeout=20) as sock:
        took = _echo_time(sock, b"x" * 40_000)
    # 40 KB at 20 KB/s each way: ~2 s (the two directions overlap).
    assert 1.7 <= took < 120.0, took
    proxy.heal()
    with _connect(proxy) as sock:
        assert _echo_time(sock, b"x" * 40_000) < 5.0


@pytest.mark.slow
def test_reset_sends_rst_and_refuses_for_a_while(proxy: FaultProxy) -> None:
    sock = _connect(proxy)
    _echo_time(sock, b"up")
    assert proxy.reset(refuse_seconds=1.0) == 1
    with pytest.raises(ConnectionResetError):
        sock.sendall(b"more")
        sock.recv(10)  # an RST, not an orderly end (which would return b"")
    sock.close()
    with pytest.raises(ConnectionResetError):  # at connect, or at the first read
        with _connect(proxy) as refused:
            refused.sendall(b"x")
            refused.recv(10)
    time.sleep(1.2)
    with _connect(proxy) as again:
        assert _echo_time(again, b"back") < 5.0
    assert proxy.figures().reset == 1 and proxy.figures().refused == 1


@pytest.mark.slow
def test_blackhole_holds_bytes_keeps_connections_open_then_delivers(proxy: FaultProxy) -> None:
    sock = _connect(proxy)
    _echo_time(sock, b"before")
    proxy.blackhole(1.5)
    t0 = time.monotonic()
    sock.sendall(b"held")
    sock.settimeout(0.8)
    with pytest.raises(TimeoutError):
        sock.recv(10)  # nothing is answered, and the connection is not closed either
    late = _connect(proxy)  # a new connection is accepted but waits as well
    late.settimeout(0.3)
    late.sendall(b"new")
    with pytest.raises(TimeoutError):
        late.recv(10)
    sock.settimeout(5)
    late.settimeout(5)
    assert sock.recv(10) == b"held"
    assert late.recv(10) == b"new"
    assert 1.3 <= time.monotonic() - t0 < 30.0
    assert _echo_time(sock, b"after") < 5.0
    sock.close()
    late.close()


def test_heal_ends_a_blackhole_early(proxy: FaultProxy) -> None:
    with _connect(proxy) as sock:
        proxy.blackhole()  # until healed
        sock.sendall(b"wait")
        time.sleep(0.3)
        proxy.heal()
        sock.settimeout(2)
        assert sock.recv(10) == b"wait"


def test_stop_closes_the_port(echo: tuple[str, int]) -> None:
    proxy = FaultProxy(*echo).start()
    with _connect(proxy) as sock:
        _echo_time(sock, b"x")
        proxy.stop()
        sock.settimeout(2)
        assert sock.recv(10) == b""
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection(("127.0.0.1", proxy.port), timeout=2)
    with pytest.raises(RuntimeError, match="not started"):
        proxy.set_latency(10)
