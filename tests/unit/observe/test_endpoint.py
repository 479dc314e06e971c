"""The driver's endpoint: where it listens (IPv4 or IPv6 metrics.host), what a bind failure says,
and the lag poller's consumer outliving a stop that gave up waiting."""

from __future__ import annotations

import socket
import threading
import urllib.request

import pytest

from ipcount.config import load_settings
from ipcount.errors import ConfigError
from ipcount.observe.endpoint import LagPoller, MetricsServer, Observability
from ipcount.observe.metrics import JobMetrics


def _settings(*overrides: str):  # type: ignore[no-untyped-def]
    return load_settings(env={}, overrides=overrides, use_default_path=False)


@pytest.mark.ipv6
def test_metrics_host_ipv6_every_interface_serves_healthz() -> None:
    metrics = JobMetrics()
    metrics.started()
    server = MetricsServer(metrics, "::", 0).start()
    try:
        for host in ("[::1]", "127.0.0.1"):
            url = f"http://{host}:{server.port}/healthz"
            with urllib.request.urlopen(url, timeout=5) as resp:  # noqa: S310 - local server
                assert resp.status == 200 and resp.read().startswith(b"ok")
    finally:
        server.stop()


def test_a_metrics_port_in_use_names_the_port_option() -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        observed = Observability(_settings("metrics.host=127.0.0.1"), port)
        with pytest.raises(ConfigError) as err:
            observed.start()
    assert "another process uses it: choose another --metrics-port / metrics.port" in str(err.value)


def test_a_metrics_host_of_another_machine_names_the_host_option() -> None:
    observed = Observability(_settings("metrics.host=192.0.2.1"), 9464)
    with pytest.raises(ConfigError) as err:
        observed.start()
    message = str(err.value)
    assert "192.0.2.1 is not an address of this machine" in message
    assert "metrics.host" in message and "--metrics-port" not in message


class _SlowOffsets:
    """A KafkaOffsetReader whose ListOffsets call hangs until released."""

    def __init__(self) -> None:
        self.inside = threading.Event()
        self.release = threading.Event()
        self.closed_by: str | None = None

    def partitions(self) -> list[tuple[str, int]]:
        return [("src", 0)]

    def offsets(self, parts: list[tuple[str, int]], which: str) -> dict[tuple[str, int], int]:
        self.inside.set()
        self.release.wait(10)
        return dict.fromkeys(parts, 10)

    def close(self) -> None:
        if self.inside.is_set() and not self.release.is_set():
            raise AssertionError("consumer closed during a ListOffsets call")
        self.closed_by = threading.current_thread().name


def test_lag_poller_stop_leaves_a_consumer_in_a_call_to_its_thread() -> None:
    metrics = JobMetrics()
    metrics.positions[("src", 0)] = 4
    poller = LagPoller(_settings(), metrics)
    reader = _SlowOffsets()
    poller._reader = reader  # the consumer it would create on its first poll
    poller.start()
    assert reader.inside.wait(5)
    poller.stop(timeout=0.1)  # gives up waiting: the call is still in flight
    assert reader.closed_by is None
    reader.release.set()
    poller._thread.join(5)
    assert reader.closed_by == "ipcount-lag"  # closed by its own thread once the call returned


def test_lag_poller_never_started_closes_its_consumer_on_stop() -> None:
    poller = LagPoller(_settings(), JobMetrics())
    reader = _SlowOffsets()
    poller._reader = reader
    poller.stop()
    assert reader.closed_by == threading.current_thread().name


def test_lag_poller_reads_end_offsets_in_the_default_configuration() -> None:
    """The poller needs only end offsets: the counting source's options (output=counts with a
    future-skew bound, which needs the query's checkpoint) must not stop it from measuring."""
    poller = LagPoller(_settings(), JobMetrics())
    try:
        reader = poller._offsets()
        assert reader is not None
    finally:
        poller.stop()
