"""The HTTP server the metrics endpoint and the dashboard listen with: IPv6 hosts bind, and a bind
failure says what to change by its cause."""

from __future__ import annotations

import logging
import socket
import struct
import threading
import time
import urllib.request
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler

import pytest

from ipcount.errors import ConfigError
from ipcount.observe.hosts import host_port
from ipcount.observe.httpserve import HttpServer


class _Hello(BaseHTTPRequestHandler):
    def do_GET(self) -> None:  # noqa: N802 - http.server hook
        self.send_response(200)
        self.send_header("Content-Length", "3")
        self.end_headers()
        self.wfile.write(b"hi\n")

    def log_message(self, format: str, *args: object) -> None:  # noqa: A002 - http.server hook
        pass


def _serve(host: str, port: int = 0) -> HttpServer:
    return HttpServer(host, port, _Hello, host_option="--host", port_option="--port")


@pytest.fixture
def running() -> Iterator[list[HttpServer]]:
    servers: list[HttpServer] = []
    yield servers
    for server in servers:
        server.shutdown()
        server.server_close()


def _start(servers: list[HttpServer], host: str) -> int:
    server = _serve(host)
    servers.append(server)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return int(server.server_address[1])


def _get(host: str, port: int) -> bytes:
    url = f"http://{host_port(host, port)}/"
    with urllib.request.urlopen(url, timeout=5) as resp:  # noqa: S310 - local test server
        return bytes(resp.read())


@pytest.mark.ipv6
def test_an_ipv6_address_binds(running: list[HttpServer]) -> None:
    port = _start(running, "::1")
    assert _get("::1", port) == b"hi\n"
    port = _start(running, "[::1]")  # as a URL writes it
    assert _get("::1", port) == b"hi\n"


@pytest.mark.ipv6
def test_every_interface_in_ipv6_takes_ipv4_too(running: list[HttpServer]) -> None:
    port = _start(running, "::")
    assert _get("::1", port) == b"hi\n"
    assert _get("127.0.0.1", port) == b"hi\n"


def test_a_port_in_use_says_choose_another_port(running: list[HttpServer]) -> None:
    port = _start(running, "127.0.0.1")
    with pytest.raises(ConfigError) as err:
        _serve("127.0.0.1", port)
    assert f"cannot listen on 127.0.0.1:{port}" in str(err.value)
    assert "another process uses it: choose another --port" in str(err.value)


def test_an_address_of_another_machine_says_fix_the_host() -> None:
    with pytest.raises(ConfigError) as err:
        _serve("192.0.2.1")  # TEST-NET-1: never an address of this machine
    assert "192.0.2.1 is not an address of this machine" in str(err.value)
    assert "--host" in str(err.value) and "--port" not in str(err.value)


def test_a_host_that_does_not_resolve_says_fix_the_host(monkeypatch: pytest.MonkeyPatch) -> None:
    def no_such_host(*args: object, **kwargs: object) -> None:
        raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")

    monkeypatch.setattr(socket, "getaddrinfo", no_such_host)
    with pytest.raises(ConfigError) as err:
        _serve("metrics.nowhere")
    assert "'metrics.nowhere' is not an address or a host name" in str(err.value)
    assert "fix --host" in str(err.value)


def test_host_port_brackets_ipv6() -> None:
    assert host_port("::", 9464) == "[::]:9464"
    assert host_port("[::1]", 1) == "[::1]:1"
    assert host_port("0.0.0.0", 9464) == "0.0.0.0:9464"


class _Slow(BaseHTTPRequestHandler):
    """Answers a large body once the test says its client has gone."""

    client_gone = threading.Event()

    def do_GET(self) -> None:  # noqa: N802 - http.server hook
        self.client_gone.wait(5)
        self.send_response(200)
        self.send_header("Content-Length", str(1 << 20))
        self.end_headers()
        for _ in range(64):
            self.wfile.write(b"x" * (1 << 14))

    def log_message(self, format: str, *args: object) -> None:  # noqa: A002 - http.server hook
        pass


def test_a_client_that_leaves_early_is_a_debug_line_without_a_traceback(
    caplog: pytest.LogCaptureFixture, capfd: pytest.CaptureFixture[str]
) -> None:
    server = HttpServer("127.0.0.1", 0, _Slow, host_option="--host", port_option="--port")
    threading.Thread(target=server.serve_forever, daemon=True).start()
    caplog.set_level(logging.DEBUG, logger="ipcount.observe.httpserve")
    try:
        client = socket.create_connection(server.server_address[:2], timeout=5)
        client.sendall(b"GET / HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
        # Leave with a reset, as a browser tab closed mid-answer does.
        client.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        client.close()
        _Slow.client_gone.set()
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline and "went away" not in caplog.text:
            time.sleep(0.05)
    finally:
        server.shutdown()
        server.server_close()
    went = [r for r in caplog.records if "went away" in r.getMessage()]
    assert went and all(r.levelno == logging.DEBUG and r.exc_info is None for r in went)
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert "Traceback" not in capfd.readouterr().err
