"""The dashboard's server binds IPv6 hosts and says what to change when it cannot bind."""

from __future__ import annotations

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
