"""The `Host` header check of the HTTP servers: a host is a name, an IPv4 address or a bracketed
IPv6 address, with an optional port of digits, and nothing else."""

from __future__ import annotations

import pytest

from ipcount.observe.hosts import host_allowed


@pytest.mark.parametrize(
    "header",
    [
        "localhost",
        "localhost:8080",
        "LOCALHOST.",
        "dash.localhost:1",
        "127.0.0.1",
        "127.0.0.1:80",
        "127.1.2.3:65535",
        "[::1]",
        "[::1]:8080",
        "[::ffff:127.0.0.1]:80",
        " 127.0.0.1:80 ",
        None,  # not a browser
    ],
)
def test_this_machines_names_pass(header: str | None) -> None:
    assert host_allowed(header)


@pytest.mark.parametrize(
    "header",
    [
        # Userinfo, or a loopback address followed by another site's name: not a host.
        "127.0.0.1:80@evil.com",
        "127.0.0.1@evil.com",
        "localhost@evil.com",
        "[::1].evil.com",
        "[::1]evil.com",
        "[::1]:80.evil.com",
        "[::1]:80@evil.com",
        "127.0.0.1:80:81",
        "127.0.0.1:8o",
        "127.0.0.1:",
        "[::1]:",
        "[::1",
        "::1]",
        "[]",
        "[127.0.0.1]",
        "[localhost]",
        "127.0.0.1/evil.com",
        "127.0.0.1 evil.com",
        "127.0.0.1\tevil.com",
        "localhost#evil.com",
        "localhost?x",
        "local%68ost",
        "evil.com",
        "",
        ":80",
    ],
)
def test_anything_else_is_refused(header: str) -> None:
    assert not host_allowed(header)


def test_allowed_names_pass_with_or_without_port_but_not_hidden_in_another() -> None:
    allowed = ("dash.example", "[2001:db8::1]", "192.0.2.7")
    assert host_allowed("dash.example:443", allowed)
    assert host_allowed("[2001:db8::1]:80", allowed)
    assert host_allowed("192.0.2.7", allowed)
    assert not host_allowed("dash.example@evil.com", allowed)
    assert not host_allowed("[2001:db8::1].evil.com", allowed)
    assert not host_allowed("192.0.2.7:80@evil.com", allowed)


def test_star_allows_any_host() -> None:
    assert host_allowed("rebind.example:80", ("*",))
