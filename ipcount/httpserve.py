"""The stdlib HTTP server the driver's /metrics and the dashboard listen with: IPv4 or IPv6 hosts,
and a bind failure as a ConfigError that says which option to change."""

from __future__ import annotations

import contextlib
import errno
import ipaddress
import socket
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from ipcount.errors import ConfigError

__all__ = ["HttpServer", "address_family", "host_port"]


def address_family(host: str) -> socket.AddressFamily:
    """AF_INET6 for an IPv6 address (`::`, `::1`, `[fe80::1]`) or a name that resolves to one
    first, else AF_INET.

    Raises:
        socket.gaierror: `host` is a name that does not resolve.
    """
    bare = host.strip("[]")
    try:
        return socket.AF_INET6 if ipaddress.ip_address(bare).version == 6 else socket.AF_INET
    except ValueError:
        pass  # a name, not an address
    infos = socket.getaddrinfo(bare, None, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    return socket.AF_INET6 if infos and infos[0][0] == socket.AF_INET6 else socket.AF_INET


def host_port(host: str, port: int) -> str:
    """`host:port`, with an IPv6 address in brackets as URLs write it."""
    bare = host.strip("[]")
    return f"[{bare}]:{port}" if ":" in bare else f"{bare}:{port}"


def _bind_hint(exc: OSError, host: str, host_option: str, port_option: str) -> str:
    if isinstance(exc, socket.gaierror):
        return f"{host!r} is not an address or a host name this machine resolves: fix {host_option}"
    if exc.errno == errno.EADDRINUSE:
        return f"another process uses it: choose another {port_option}"
    if exc.errno == errno.EADDRNOTAVAIL:
        return (
            f"{host} is not an address of this machine: choose one of its addresses, "
            f"127.0.0.1 or 0.0.0.0 (every interface) with {host_option}"
        )
    if exc.errno == errno.EAFNOSUPPORT:
        return f"this machine has no IPv6: choose an IPv4 address with {host_option}"
    if exc.errno == errno.EACCES:
        return f"ports below 1024 need privileges: choose another {port_option}"
    return f"check {host_option} and {port_option}"


class HttpServer(ThreadingHTTPServer):
    """A ThreadingHTTPServer (daemon threads) on an IPv4 or IPv6 host; `::` also takes IPv4
    connections where the system allows it, as 0.0.0.0 does for IPv4.

    Raises:
        ConfigError: the host does not resolve or the address cannot be bound; the message names
            `host_option` or `port_option` by the cause.
    """

    daemon_threads = True

    def __init__(
        self,
        host: str,
        port: int,
        handler: type[BaseHTTPRequestHandler],
        *,
        host_option: str,
        port_option: str,
    ) -> None:
        bare = host.strip("[]")
        try:
            self.address_family = address_family(bare)
            super().__init__((bare, port), handler)
        except OSError as exc:
            hint = _bind_hint(exc, bare, host_option, port_option)
            raise ConfigError(
                f"cannot listen on {host_port(bare, port)}: {exc.strerror or exc}; {hint}"
            ) from exc

    def server_bind(self) -> None:
        if self.address_family == socket.AF_INET6 and self.server_address[0] == "::":
            # Dual stack, as `python -m http.server --bind ::` does: a probe of 127.0.0.1 works.
            with contextlib.suppress(AttributeError, OSError):
                self.socket.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
        super().server_bind()
