"""The dashboard's server binds IPv6 hosts and says what to change when it cannot bind."""

from __future__ import annotations

import http.client
import threading
import urllib.request
from typing import Any

import pytest

from ipcount.dashboard.server import DashboardServer
from ipcount.errors import ConfigError


@pytest.mark.ipv6
def test_host_ipv6_serves_the_page() -> None:
    none: Any = None  # the page itself needs neither the live top-N nor the metrics
    server = DashboardServer("::", 0, none, none)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        port = server.server_address[1]
        assert server.url == f"http://[::]:{port}/"
        for host in ("[::1]", "127.0.0.1"):
            with urllib.request.urlopen(f"http://{host}:{port}/", timeout=5) as resp:  # noqa: S310
                assert resp.status == 200 and b"<html" in resp.read().lower()
    finally:
        server.shutdown()
        server.server_close()


def test_an_address_of_another_machine_names_host() -> None:
    none: Any = None
    with pytest.raises(ConfigError) as err:
        DashboardServer("192.0.2.1", 0, none, none)
    assert "not an address of this machine" in str(err.value) and "--host" in str(err.value)


def _status(port: int, host_header: str | None) -> int:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
    try:
        conn.putrequest("GET", "/", skip_host=True)
        if host_header is not None:
            conn.putheader("Host", host_header)
        conn.endheaders()
        return conn.getresponse().status
    finally:
        conn.close()


@pytest.mark.parametrize(
    ("allowed", "host_header", "status"),
    [
        ((), "localhost:{port}", 200),
        ((), "127.0.0.1:{port}", 200),
        ((), "[::1]:{port}", 200),
        ((), None, 200),  # not a browser
        # A DNS-rebinding page: its own name, resolved to 127.0.0.1.
        ((), "rebind.example:{port}", 403),
        ((), "rebind.example", 403),
        ((), "", 403),
        (("dash.example",), "dash.example:{port}", 200),
        (("dash.example",), "rebind.example:{port}", 403),
        (("*",), "rebind.example:{port}", 200),
    ],
)
def test_only_requests_for_this_servers_names_are_answered(
    allowed: tuple[str, ...], host_header: str | None, status: int
) -> None:
    none: Any = None
    server = DashboardServer("127.0.0.1", 0, none, none, allowed_hosts=allowed)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        port = server.server_address[1]
        header = None if host_header is None else host_header.format(port=port)
        assert _status(port, header) == status
    finally:
        server.shutdown()
        server.server_close()
