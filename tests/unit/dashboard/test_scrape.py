"""The dashboard's health panel reads the job's Prometheus endpoint: a real HTTP endpoint served by
prometheus_client with the job's metric names, an absent one, an unreachable one, a wrong one."""

from __future__ import annotations

import http.server
import socket
import threading
from collections.abc import Iterator

import pytest
from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
    start_http_server,
)

from ipcount.dashboard.scrape import MetricsPoller, parse_metrics
from ipcount.local.broker import free_port
from ipcount.queries import COUNTS_QUERY


@pytest.fixture
def job_metrics() -> Iterator[tuple[str, dict[str, object]]]:
    reg = CollectorRegistry()
    m: dict[str, object] = {
        "lag": Gauge("ipcount_source_lag_records", "lag", ["topic", "partition"], registry=reg),
        "wm": Gauge("ipcount_watermark_delay_seconds", "wm", registry=reg),
        "batch": Histogram("ipcount_batch_duration_seconds", "batch", registry=reg),
        "late": Counter("ipcount_late_records", "late", registry=reg),
        "malformed": Counter("ipcount_malformed_records", "bad", registry=reg),
        "records": Counter("ipcount_records", "all", registry=reg),
        "up": Gauge("ipcount_query_up", "up", registry=reg),
    }
    port = free_port()
    server, thread = start_http_server(port, addr="127.0.0.1", registry=reg)
    try:
        yield f"http://127.0.0.1:{port}/metrics", m
    finally:
        server.shutdown()
        server.server_close()
        thread.join(5)


def test_reads_the_jobs_metrics_and_rates_between_reads(
    job_metrics: tuple[str, dict[str, object]],
) -> None:
    url, m = job_metrics
    lag: Gauge = m["lag"]  # type: ignore[assignment]
    lag.labels("src", "0").set(120)
    lag.labels("src", "1").set(30)
    m["wm"].set(6.5)  # type: ignore[attr-defined]
    m["up"].set(1)  # type: ignore[attr-defined]
    for s in (1.0, 3.0):
        m["batch"].observe(s)  # type: ignore[attr-defined]
    m["records"].inc(1000)  # type: ignore[attr-defined]
    m["late"].inc(4)  # type: ignore[attr-defined]
    m["malformed"].inc(2)  # type: ignore[attr-defined]

    poller = MetricsPoller(url, timeout=2)
    h = poller.read()
    assert h.status == "ok", h.message
    assert (h.up, h.lag_records, h.watermark_delay_seconds) == (True, 150, 6.5)
    assert (h.batches, h.batch_seconds) == (2, 2.0)  # the mean so far
    assert (h.records_total, h.late_total, h.malformed_total) == (1000, 4, 2)
    assert h.records_per_second is None  # needs two reads

    m["batch"].observe(0.5)  # type: ignore[attr-defined]
    m["records"].inc(500)  # type: ignore[attr-defined]
    m["up"].set(0)  # type: ignore[attr-defined]
    h2 = poller.read()
    assert h2.batch_seconds == 0.5  # the batches since the last read
    assert h2.up is False
    assert h2.records_per_second is not None and h2.records_per_second > 0
    assert h2.to_json()["status"] == "ok"


def test_no_endpoint_given_is_said_plainly() -> None:
    h = MetricsPoller(None).read()
    assert h.status == "none"
    assert "no metrics endpoint given" in h.message and "--metrics-url" in h.message
    assert h.lag_records is None


def test_an_unreachable_endpoint_is_reported_with_its_address() -> None:
    url = f"http://127.0.0.1:{free_port()}/metrics"
    h = MetricsPoller(url, timeout=1).read()
    assert h.status == "unreachable"
    assert url in h.message


def test_an_endpoint_without_the_jobs_metrics_is_not_taken_for_healthy() -> None:
    class _Page(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 - http.server's hook name
            body = b"<html>not metrics</html>"
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Page)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        h = MetricsPoller(f"http://127.0.0.1:{server.server_address[1]}/", timeout=2).read()
    finally:
        server.shutdown()
        server.server_close()
    assert h.status == "invalid"
    assert "ipcount_" in h.message


def test_parse_sums_the_lag_over_partitions_and_ignores_other_metrics() -> None:
    text = (
        "# TYPE ipcount_source_lag_records gauge\n"
        'ipcount_source_lag_records{topic="a",partition="0"} 5\n'
        'ipcount_source_lag_records{topic="a",partition="1"} 7\n'
        "# TYPE python_gc_objects_collected counter\n"
        "python_gc_objects_collected_total 3\n"
    )
    values = parse_metrics(text)
    assert values["lag_records"] == 12
    assert values["watermark_delay_seconds"] is None


def test_not_yet_known_values_are_none_not_nan() -> None:
    text = (
        "# TYPE ipcount_watermark_delay_seconds gauge\n"
        "ipcount_watermark_delay_seconds NaN\n"
        "# TYPE ipcount_query_up gauge\n"
        "ipcount_query_up 1.0\n"
    )
    values = parse_metrics(text)
    assert values["watermark_delay_seconds"] is None and values["up"] == 1


def test_a_server_that_does_not_answer_in_http_is_a_status_not_an_exception() -> None:
    # A wrong --metrics-url, e.g. an SSH port: it answers with a banner, not an HTTP status line.
    listener = socket.create_server(("127.0.0.1", 0))

    def banner() -> None:
        conn, _ = listener.accept()
        with conn:
            conn.sendall(b"SSH-2.0-OpenSSH_9.6p1 Debian-4\r\n")
            conn.recv(4096)

    thread = threading.Thread(target=banner, daemon=True)
    thread.start()
    url = f"http://127.0.0.1:{listener.getsockname()[1]}/metrics"
    try:
        h = MetricsPoller(url, timeout=2).read()
    finally:
        listener.close()
        thread.join(5)
    assert h.status == "invalid"
    assert url in h.message and "HTTP" in h.message


def test_batch_time_is_the_counting_querys_not_the_dead_letter_querys() -> None:
    reg = CollectorRegistry()
    batch = Histogram("ipcount_batch_duration_seconds", "batch", ["query"], registry=reg)
    for s in (1.0, 3.0):
        batch.labels(query=COUNTS_QUERY).observe(s)
    batch.labels(query="ipcount-dead-letter").observe(100.0)
    values = parse_metrics(generate_latest(reg).decode())
    assert (values["batches"], values["batch_seconds_sum"]) == (2, 4.0)
