"""Debian's real nginx writes the log, the real job counts it: every line nginx writes, at any
length it writes (8 KB URIs and headers, `\\xHH`-escaped bytes, a hostile Basic-auth user, HTTP/0.9,
a TLS handshake on the plain port), is counted exactly, against a second log of `$msec
$remote_addr` written by the same nginx for the same requests."""

from __future__ import annotations

import base64
import os
import re
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from confluent_kafka import Producer

from ipcount.config import Settings
from ipcount.kafka.topic_reader import TopicReader
from ipcount.kafka.topics import ensure_topics
from ipcount.local.broker import free_port
from ipcount.verify.ledger import Ledger

# nginx's defaults, written out: a request line or one header line must fit one 8 KB buffer, and a
# request's header may take at most 4 of them (after the 1 KB client_header_buffer_size).
_CONF = """\
master_process off;
daemon off;
pid {dir}/nginx.pid;
error_log {dir}/error.log info;
events {{ worker_connections 64; }}
http {{
    client_header_buffer_size 1k;
    large_client_header_buffers 4 8k;
    client_body_temp_path {dir}/tmp/body;
    proxy_temp_path {dir}/tmp/proxy;
    fastcgi_temp_path {dir}/tmp/fastcgi;
    uwsgi_temp_path {dir}/tmp/uwsgi;
    scgi_temp_path {dir}/tmp/scgi;
    log_format truth '$msec $remote_addr';
    access_log {dir}/access.log combined;
    access_log {dir}/truth.log truth;
    server {{
        {listen}
        location / {{ return 200 "ok\\n"; }}
    }}
}}
"""


@dataclass
class Nginx:
    """A running nginx: its port, the addresses it listens on and its two logs."""

    prefix: Path
    port: int
    hosts: tuple[str, ...]
    proc: subprocess.Popen[bytes]

    def stop(self) -> None:
        """Stop nginx by its PID, gracefully: every request's lines are in the logs after it."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGQUIT)
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(15)

    @property
    def access_log(self) -> Path:
        return self.prefix / "access.log"

    @property
    def truth_log(self) -> Path:
        return self.prefix / "truth.log"


def _nginx_binary() -> str:
    # /usr/sbin is not on every user's PATH.
    found = shutil.which("nginx") or shutil.which("nginx", path="/usr/sbin")
    if found:
        return found
    if os.environ.get("CI") == "true":
        pytest.fail("nginx is missing under CI: .ci/run installs Debian's nginx first")
    pytest.skip("nginx not installed (apt-get install nginx) - real nginx lines are not checked")


def _start(binary: str, prefix: Path, port: int, hosts: tuple[str, ...]) -> subprocess.Popen[bytes]:
    """nginx in the foreground (no daemon, no master: its PID is the process; no user switch)."""
    listen = " ".join(f"listen {'[' + h + ']' if ':' in h else h}:{port};" for h in hosts)
    (prefix / "tmp").mkdir(exist_ok=True)
    (prefix / "nginx.conf").write_text(_CONF.format(dir=prefix, listen=listen))
    # -e: the error log before the configuration is read (the default is under /var/log).
    proc = subprocess.Popen(
        [
            binary,
            "-p",
            str(prefix),
            "-c",
            str(prefix / "nginx.conf"),
            "-e",
            str(prefix / "error.log"),
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            return proc
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return proc
        except OSError:
            time.sleep(0.1)
    return proc


@pytest.fixture
def nginx(tmp_path: Path, ipv6_loopback: bool) -> Iterator[Nginx]:
    """Debian's nginx on a free loopback port (127.0.0.1, and [::1] where there is one), its own
    prefix in tmp_path; stopped by its PID afterwards."""
    binary = _nginx_binary()
    hosts = ("127.0.0.1", "::1") if ipv6_loopback else ("127.0.0.1",)
    prefix = tmp_path / "nginx"
    prefix.mkdir()
    for _ in range(5):  # a free port may be taken before nginx binds it
        port = free_port()
        proc = _start(binary, prefix, port, hosts)
        if proc.poll() is None:
            break
    else:
        error_log = prefix / "error.log"
        pytest.fail("nginx did not start: " + error_log.read_text(errors="replace")[-2000:])
    server = Nginx(prefix, port, hosts, proc)
    try:
        yield server
    finally:
        server.stop()


def _exchange(
    nginx: Nginx, raw: bytes, *, host: str = "127.0.0.1", source: str = "", half_close: bool = False
) -> bytes:
    """Send raw bytes on a new connection (from `source`, any 127.x address) and read the answer
    until nginx closes; `half_close` ends the sending side first (a request nginx must wait for)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as s:
        s.settimeout(20)
        if source:
            s.bind((source, 0))
        s.connect((host, nginx.port))
        answer = b""
        try:
            s.sendall(raw)
            if half_close:
                s.shutdown(socket.SHUT_WR)
            while chunk := s.recv(65536):
                answer += chunk
        except ConnectionError:
            pass  # nginx may reset a connection it refused (414) while request bytes are unread
    return answer


def _get(target: bytes, *headers: bytes, version: bytes = b"HTTP/1.1") -> bytes:
    host = [b"Host: localhost"] if version == b"HTTP/1.1" else []
    lines = [b"GET " + target + b" " + version, *host, *headers, b"Connection: close"]
    return b"\r\n".join(lines) + b"\r\n\r\n"


def _basic(user: bytes) -> bytes:
    return b"Authorization: Basic " + base64.b64encode(user + b":secret")


def _status(answer: bytes) -> int:
    match = re.match(rb"HTTP/1\.[01] (\d{3}) ", answer)
    return int(match.group(1)) if match else 0


# Bytes >= 0x80 nginx writes as \xHH: 4 log bytes for each.
_HIGH = bytes(0x80 + i % 128 for i in range(8192))
# A Basic-auth user name (it ends at the first `:`, so fake times carry none) that imitates the rest
# of a combined line: `]`, `[`, spaces, quotes, a fake address, a fake time.
_EVIL_USER = b'evil] [01/Jan/2000 +0000] "GET /x HTTP/1.1" 200 0 "-" "-" 10.9.9.9 - - [ ]'


def _hostile_requests(nginx: Nginx) -> None:
    """The lines a client can make nginx write; asserts nginx answered as the test means it to."""
    # The longest request line nginx serves (one 8 KB buffer, CRLF included), and one past it.
    long_uri = b"/" + b"u" * (8192 - len(b"GET / HTTP/1.1\r\n"))
    assert _status(_exchange(nginx, _get(long_uri))) == 200
    assert _status(_exchange(nginx, _get(long_uri + b"u" * 100))) == 414
    # 8 KB User-Agent and Referer (raw bytes >= 0x80 in both), and a hostile Basic-auth user.
    ua = b"User-Agent: Mozilla/5.0 " + _HIGH[: 8190 - 24]
    referer = b'Referer: http://x/"q"\\' + b"r" * (8190 - 22)
    for user in (_EVIL_USER, _EVIL_USER + b"\t\x00\x7f" + _HIGH[:200]):
        answer = _exchange(
            nginx, _get(b"/" + _HIGH[:300], ua, referer, _basic(user)), source="127.0.0.2"
        )
        assert _status(answer) == 200
    # The longest line nginx's default buffers allow: HTTP/1.0 (no Host), an 8 KB URI, 8 KB
    # User-Agent and Referer, a 6 KB user name, all bytes >= 0x80 (about 120 KB in the log).
    big = _get(
        b"/" + _HIGH[: 8192 - len(b"GET / HTTP/1.0\r\n")],
        b"User-Agent: " + _HIGH[: 8190 - 12],
        b"Referer: " + _HIGH[: 8190 - 9],
        _basic(_HIGH[:6000]),
        version=b"HTTP/1.0",
    )
    assert _status(_exchange(nginx, big, source="127.0.0.3")) == 200
    # HTTP/0.9: no version, no headers; nginx answers the bare body.
    assert _exchange(nginx, b"GET /\r\n") == b"ok\n"
    # A TLS ClientHello on the plain port, and other bytes that are no request at all.
    hello = bytes.fromhex("16030100a5010000a10303") + bytes(32) + b"\x00\x00\x02\x13\x01\x01\x00"
    assert _status(_exchange(nginx, hello, source="127.0.0.4")) == 400
    assert _status(_exchange(nginx, b"\x00\x01\x02\r\n\r\n")) == 400
    assert _status(_exchange(nginx, b"GET /a b\x01c HTTP/1.1\r\n\r\n")) == 400
    assert _exchange(nginx, b"\r\n\r\n", half_close=True) == b""  # logged as "" 400 0
    assert _status(_exchange(nginx, _get(b'/a"b\\c?d=%22&e=\xff'))) == 200
    if "::1" in nginx.hosts:
        assert _status(_exchange(nginx, _get(b"/v6" + _HIGH[:100], ua), host="::1")) == 200


def _ordinary_requests(nginx: Nginx, n: int) -> None:
    """n plain requests from 127.0.0.1-127.0.0.8 (and ::1), spread over a few windows."""
    sources = [("127.0.0.1", f"127.0.0.{i}") for i in range(1, 9)]
    if "::1" in nginx.hosts:
        sources.append(("::1", ""))
    for i in range(n):
        host, source = sources[i % len(sources)]
        answer = _exchange(nginx, _get(f"/page/{i}?q={i}".encode()), host=host, source=source)
        assert _status(answer) == 200, answer[:200]
        time.sleep(0.02)


def _logged(nginx: Nginx) -> tuple[list[bytes], list[int], Ledger]:
    """The combined log's lines, their event times (ms) and the ledger, from the truth log nginx
    wrote beside it."""
    lines = nginx.access_log.read_bytes().split(b"\n")
    assert lines.pop() == b"", "the combined log does not end with a newline"
    truth = nginx.truth_log.read_text(encoding="ascii").splitlines()
    assert len(lines) == len(truth), (len(lines), len(truth))
    ledger = Ledger(window_ms=5000)
    times = []
    for line, fact in zip(lines, truth, strict=True):
        msec, addr = fact.split(" ")
        # Written by the same request, in order: the combined line opens with the same address.
        assert line.startswith(addr.encode() + b" "), (fact, line[:200])
        # $time_local has second precision: the line's event time is $msec's second.
        times.append(int(msec.split(".")[0]) * 1000)
        ledger.add(times[-1], addr)
    return lines, times, ledger


def _produce(settings: Settings, lines: list[bytes], times: list[int]) -> None:
    """One record per line, its Kafka timestamp the event time (as loadgen does)."""
    producer = Producer({"bootstrap.servers": settings.kafka.bootstrap_servers, "linger.ms": 5})
    for line, ms in zip(lines, times, strict=True):
        producer.produce(settings.topics.source, value=line, timestamp=ms)
    assert producer.flush(60) == 0


def test_every_line_a_real_nginx_writes_is_counted_exactly(
    nginx: Nginx, make_settings, ipcount_cli, tmp_path: Path
) -> None:  # type: ignore[no-untyped-def]
    _hostile_requests(nginx)
    _ordinary_requests(nginx, 300)
    nginx.stop()
    lines, times, ledger = _logged(nginx)
    lengths = sorted(len(line) for line in lines)
    # What the test means to show: nginx itself wrote lines far past 8 KB, the refused ones too.
    assert lengths[-1] > 100_000, lengths[-5:]
    assert sum(n > 8192 for n in lengths) >= 6, lengths[-10:]
    assert any(b'" 414 ' in line for line in lines)
    assert any(b'] "GET /" 200 ' in line for line in lines)  # HTTP/0.9
    assert any(b'] "\\x16\\x03\\x01' in line for line in lines)  # the TLS ClientHello

    settings = make_settings()
    ensure_topics(settings)
    _produce(settings, lines, times)
    done = ipcount_cli(
        settings,
        "run",
        "--available-now",
        "--close-all-windows",
        env={"IPCOUNT_JOB_DEAD_LETTER": "true"},
    )
    assert done.returncode == 0, done.stderr[-3000:]

    with TopicReader(settings.kafka.to_librdkafka("consumer"), settings.topics.dead_letter) as r:
        dead = [
            (
                dict(rec.headers or []).get("ipcount.reason", b"?").decode(),
                len(rec.value or b""),
                (rec.value or b"")[:160],
            )
            for rec in r.read_to_end(60)
        ]
    malformed = sum(
        int(m.group(1))
        for m in re.finditer(r"\bipcount batch \d+: .*? malformed=(\d+)", done.stderr)
    )
    ledger.save(tmp_path / "ledger.jsonl")
    verify = ipcount_cli(
        settings, "verify", "--ledger", str(tmp_path / "ledger.jsonl"), timeout=120
    )
    last = verify.stdout.strip().splitlines()[-1] if verify.stdout.strip() else verify.stderr
    assert dead == [], (
        f"{len(dead)} of nginx's {len(lines)} lines rejected (malformed={malformed}; "
        f"verify: {last}): {dead}"
    )
    assert malformed == 0, malformed
    assert verify.returncode == 0, verify.stdout + verify.stderr[-3000:]
    assert last.endswith("missing=0 duplicates=0 wrong=0 exact=true"), last
    assert f"results={len(ledger.counts)}" in last, last
