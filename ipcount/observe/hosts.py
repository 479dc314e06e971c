"""Host names and addresses of the HTTP servers (driver / CLI): IPv4 or IPv6, `host:port`, the
`Host` header check against DNS rebinding, and what to fix when a bind fails."""

from __future__ import annotations

import errno
import ipaddress
import re
import socket
from collections.abc import Iterable

__all__ = ["address_family", "host_port", "host_allowed", "bind_hint"]

# A Host header: a bracketed IPv6 address, or a name / IPv4 address (letters, digits, `-`, `_`,
# `.`), then an optional `:port` of digits. Nothing else: no userinfo (`127.0.0.1:80@evil.com`),
# nothing after the bracket (`[::1].evil.com`), no percent-encoding.
_HOST_HEADER = re.compile(r"(?:\[(?P<v6>[0-9a-f:.]+)\]|(?P<name>[a-z0-9_.-]+))(?::[0-9]{1,5})?")


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


def host_allowed(header: str | None, allowed: Iterable[str] = ()) -> bool:
    """Whether a request's `Host` header names this server: `localhost`, a loopback address, or
    one of `allowed` (names or addresses; "*" allows any). A request without the header (not a
    browser's: browsers always send it) passes. The check against DNS rebinding: a page from
    another site that resolves its own name to 127.0.0.1 still sends that name."""
    if header is None:
        return True
    names = {a.strip().strip("[]").lower().rstrip(".") for a in allowed if a.strip()}
    if "*" in names:
        return True
    host = _host_of(header)
    if not host:
        return False
    if host == "localhost" or host.endswith(".localhost") or host in names:
        return True
    try:
        addr = ipaddress.ip_address(host)
    except ValueError:
        return False
    mapped = getattr(addr, "ipv4_mapped", None)
    return addr.is_loopback or (mapped is not None and mapped.is_loopback)


def _host_of(header: str) -> str | None:
    """The host a `Host` header names (an IPv6 address without brackets, a name without its
    trailing dot), or None when the header is not a host with an optional port."""
    match = _HOST_HEADER.fullmatch(header.strip().lower())
    if match is None:
        return None
    if match["v6"] is not None:
        try:
            ipaddress.IPv6Address(match["v6"])
        except ValueError:
            return None
        return match["v6"]
    return match["name"].rstrip(".")


def bind_hint(exc: OSError, host: str, host_option: str, port_option: str) -> str:
    """What to change when binding `host` failed with `exc`, naming the option to fix."""
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
