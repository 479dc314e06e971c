"""The lag poller against a broker that stops answering (a blackhole in a fault proxy in front of
it): /healthz must not go on reporting the last lag it saw, but say that the broker has not
answered, and be healthy again once it answers."""

from __future__ import annotations

import time
from pathlib import Path

from ipcount.config import load_settings
from ipcount.kafka.topics import ensure_topics
from ipcount.local.broker import free_port
from ipcount.local.fault_proxy import FaultProxy
from ipcount.local.kraft import KafkaBroker
from ipcount.observe.endpoint import LagPoller
from ipcount.observe.metrics import JobMetrics

ROOT = Path(__file__).resolve().parents[3]


def _settings(bootstrap: str, tmp_path: Path):  # type: ignore[no-untyped-def]
    return load_settings(
        ROOT / "conf" / "ipcount.toml",
        env={},
        overrides=[
            f"kafka.bootstrap_servers={bootstrap}",
            "topics.source=src-unanswered",
            "metrics.lag_poll_seconds=1",
            f"job.checkpoint_location={tmp_path / 'ckpt'}",
        ],
    )


def _until(cond, timeout: float):  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        got = cond()
        if got:
            return got
        time.sleep(0.2)
    return None


def test_a_broker_that_stops_answering_is_named_by_healthz(tmp_path: Path) -> None:
    port = free_port()
    with FaultProxy("127.0.0.1", port) as proxy:
        broker = KafkaBroker(tmp_path / "broker", port=port, advertised_port=proxy.port)
        broker.start(timeout=60)
        try:
            ensure_topics(_settings(broker.internal_bootstrap, tmp_path))
            metrics = JobMetrics(stall_seconds=2.0)
            metrics.started()
            poller = LagPoller(_settings(proxy.address, tmp_path), metrics).start()
            try:
                assert _until(lambda: metrics.lag.collect()[0].samples, 30), "no lag measured"
                assert metrics.health().ok, metrics.health()

                proxy.blackhole()
                t0 = time.monotonic()
                answers = []

                def named() -> bool:
                    answers.append(metrics.health().reason)
                    return f"{proxy.address} has not answered" in answers[-1]

                assert _until(named, 15), sorted(set(answers))
                health = metrics.health()
                print(f"blackhole: /healthz {health.status} after {time.monotonic() - t0:.1f}s:")
                print(f"  {health.reason}")
                assert health.status == 503 and health.reason.startswith("stalled"), health

                proxy.heal()
                assert _until(lambda: metrics.health().ok, 15), metrics.health()
            finally:
                poller.stop()
        finally:
            broker.stop()
