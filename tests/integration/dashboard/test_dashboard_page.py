"""The dashboard page in a real headless browser (Debian's chromium): the chart is drawn, with one
bar per top IP labelled with its address, and the screenshot has the bars' colour."""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import socket
import struct
import subprocess
import threading
import zlib
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from test_dashboard_live import BATCHES, EXPECTED_TOP3, Dashboard, Sink

from ipcount.config import Settings
from ipcount.kafka.topics import ensure_topics

BAR_RGB = (0x2F, 0x6F, 0xDF)  # --bar in static/style.css
LATE_RGB = (0xF0, 0xA0, 0x20)  # --late


@pytest.fixture
def chromium() -> str:
    """Debian's chromium, checked before any broker or server starts."""
    found = shutil.which("chromium") or shutil.which("chromium-browser")
    if found:
        return found
    if os.environ.get("CI") == "true":
        pytest.fail("chromium is missing under CI: .ci/run installs Debian's chromium first")
    pytest.skip("chromium not installed (apt-get install chromium) - the page is not checked")


def _browser(chromium: str, *args: str) -> subprocess.CompletedProcess[str]:
    cmd = [
        chromium,
        "--headless",
        "--no-sandbox",  # as root (CI containers) chromium refuses to start sandboxed
        "--disable-gpu",
        "--disable-dev-shm-usage",
        "--hide-scrollbars",
        "--virtual-time-budget=4000",
        *args,
    ]
    return subprocess.run(["nice", "-n", "10", *cmd], capture_output=True, text=True, timeout=120)


def decode_png(data: bytes) -> tuple[int, int, list[bytes]]:
    """(width, height, rows of RGB(A) bytes) of an 8-bit RGB or RGBA, non-interlaced PNG."""
    assert data[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG"
    pos, idat = 8, b""
    width = height = channels = 0
    while pos < len(data):
        (length,) = struct.unpack(">I", data[pos : pos + 4])
        kind, body = data[pos + 4 : pos + 8], data[pos + 8 : pos + 8 + length]
        pos += 12 + length
        if kind == b"IHDR":
            width, height, depth, color, _, _, interlace = struct.unpack(">IIBBBBB", body)
            assert depth == 8 and color in (2, 6) and interlace == 0, (depth, color, interlace)
            channels = 3 if color == 2 else 4
        elif kind == b"IDAT":
            idat += body
    raw = zlib.decompress(idat)
    stride = width * channels
    rows: list[bytes] = []
    prev = bytearray(stride)
    for y in range(height):
        f = raw[y * (stride + 1)]
        line = bytearray(raw[y * (stride + 1) + 1 : (y + 1) * (stride + 1)])
        for i in range(stride):
            a = line[i - channels] if i >= channels else 0
            b = prev[i]
            c = prev[i - channels] if i >= channels else 0
            if f == 1:
                line[i] = (line[i] + a) & 0xFF
            elif f == 2:
                line[i] = (line[i] + b) & 0xFF
            elif f == 3:
                line[i] = (line[i] + (a + b) // 2) & 0xFF
            elif f == 4:
                p = a + b - c
                pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
                pred = a if pa <= pb and pa <= pc else b if pb <= pc else c
                line[i] = (line[i] + pred) & 0xFF
        rows.append(bytes(line))
        prev = line
    return width, height, [bytes(r) if channels == 3 else _rgb(r) for r in rows]


def _rgb(row: bytes) -> bytes:
    return b"".join(row[i : i + 3] for i in range(0, len(row), 4))


def count_pixels(rows: list[bytes], rgb: tuple[int, int, int], tol: int = 6) -> int:
    n = 0
    for row in rows:
        for i in range(0, len(row), 3):
            if all(abs(row[i + k] - rgb[k]) <= tol for k in range(3)):
                n += 1
    return n


@pytest.fixture
def page(chromium: str, make_settings: Callable[..., Settings]) -> Iterator[Dashboard]:
    settings = make_settings()
    ensure_topics(settings)
    sink = Sink(settings)
    for results, late in BATCHES:
        sink.commit(results, late)
    d = Dashboard(settings)
    try:
        d.top(3, 3)  # the data is there before the browser looks
        yield d
    finally:
        d.stop()


def test_page_draws_the_top_n_as_bars(chromium: str, page: Dashboard, tmp_path: Path) -> None:
    # The page shows the newest window by default: here the one only late records reached.
    out = _browser(chromium, "--dump-dom", f"{page.url}?n=3")
    assert out.returncode == 0, out.stderr[-2000:]
    dom = out.stdout
    bars = re.findall(r'<rect class="bar" data-ip="([^"]+)" data-count="(\d+)"', dom)
    newest = EXPECTED_TOP3[-1]["top"]
    assert bars == [(r["ip"], str(r["count"])) for r in newest]  # type: ignore[index]
    assert len(re.findall(r'<rect class="series[ "]', dom)) == 3
    assert "no final result: every record came late" in dom
    assert "no metrics endpoint given" in dom

    shot = tmp_path / "page.png"
    out = _browser(chromium, f"--screenshot={shot}", "--window-size=1200,900", f"{page.url}?n=3")
    assert out.returncode == 0 and shot.exists(), out.stderr[-2000:]
    width, height, rows = decode_png(shot.read_bytes())
    assert (width, height) == (1200, 900)
    # The newest window's only IP is all late: its bar is drawn in the late colour.
    assert count_pixels(rows, LATE_RGB) > 500


def test_page_shows_final_bars_for_a_window_with_final_results(
    chromium: str, make_settings: Callable[..., Settings], tmp_path: Path
) -> None:
    settings = make_settings()
    ensure_topics(settings)
    Sink(settings).commit(BATCHES[0][0], [])
    d = Dashboard(settings)
    try:
        d.top(10, 1)
        out = _browser(chromium, "--dump-dom", f"{d.url}?n=4")
        shot = tmp_path / "page.png"
        snap = _browser(chromium, f"--screenshot={shot}", "--window-size=1200,900", f"{d.url}?n=4")
    finally:
        d.stop()
    assert out.returncode == 0, out.stderr[-2000:]
    bars = re.findall(r'<rect class="bar" data-ip="([^"]+)"', out.stdout)
    assert bars == ["10.0.0.1", "10.0.0.2", "10.0.0.3", "10.0.0.10"]  # ties in address order
    labels = re.findall(r'<text [^>]*class="ip"[^>]*>([^<]+)</text>', out.stdout)
    assert labels == bars
    assert snap.returncode == 0 and shot.exists(), snap.stderr[-2000:]
    _, _, rows = decode_png(shot.read_bytes())
    # Four bars of 18 px height, the shortest 30/50 of the longest: thousands of bar pixels.
    assert count_pixels(rows, BAR_RGB) > 4 * 18 * 100


def test_a_wrong_metrics_url_leaves_the_chart_drawing(
    chromium: str, make_settings: Callable[..., Settings]
) -> None:
    # --metrics-url pointing at an SSH server: it answers with a banner, not HTTP.
    listener = socket.create_server(("127.0.0.1", 0))

    def banners() -> None:
        while True:
            try:
                conn, _ = listener.accept()
            except OSError:
                return
            with conn:
                conn.settimeout(2)
                conn.sendall(b"SSH-2.0-OpenSSH_9.6p1 Debian-4\r\n")
                with contextlib.suppress(OSError):
                    conn.recv(4096)  # the request: closing before it arrives would reset

    threading.Thread(target=banners, daemon=True).start()
    settings = make_settings()
    ensure_topics(settings)
    Sink(settings).commit(BATCHES[0][0], [])
    url = f"http://127.0.0.1:{listener.getsockname()[1]}/metrics"
    d = Dashboard(settings, "--metrics-url", url)
    try:
        d.top(10, 1)
        out = _browser(chromium, "--dump-dom", f"{d.url}?n=2")
    finally:
        d.stop()
        listener.close()
    assert out.returncode == 0, out.stderr[-2000:]
    assert re.findall(r'<rect class="bar" data-ip="([^"]+)"', out.stdout) == [
        "10.0.0.1",
        "10.0.0.2",
    ]
    assert f"{url} did not answer in HTTP" in out.stdout
