"""A broker that tells clients to reach it through another port (a fault proxy's), while it
talks to itself directly (no JVM: the configuration only; the broker runs in
tests/integration/local/test_broker_behind_proxy.py)."""

from __future__ import annotations

from pathlib import Path

from ipcount.local.kraft import KafkaBroker


def test_clients_are_sent_to_the_advertised_port_and_the_broker_keeps_its_own(
    tmp_path: Path,
) -> None:
    broker = KafkaBroker(tmp_path, port=9092, advertised_port=19092, internal_port=9094)
    props = broker.server_properties(9093)
    assert props["listeners"] == (
        "PLAINTEXT://127.0.0.1:9092,INTERNAL://127.0.0.1:9094,CONTROLLER://127.0.0.1:9093"
    )
    assert props["advertised.listeners"] == (
        "PLAINTEXT://127.0.0.1:19092,INTERNAL://127.0.0.1:9094"
    )
    assert props["inter.broker.listener.name"] == "INTERNAL"
    assert "INTERNAL:PLAINTEXT" in props["listener.security.protocol.map"].split(",")
    assert broker.bootstrap == "127.0.0.1:9092"
    assert broker.internal_bootstrap == "127.0.0.1:9094"


def test_without_a_detour_nothing_changes(tmp_path: Path) -> None:
    broker = KafkaBroker(tmp_path, port=9092)
    props = broker.server_properties(9093)
    assert props["listeners"] == "PLAINTEXT://127.0.0.1:9092,CONTROLLER://127.0.0.1:9093"
    assert props["advertised.listeners"] == "PLAINTEXT://127.0.0.1:9092"
    assert props["inter.broker.listener.name"] == "PLAINTEXT"
    assert broker.internal_bootstrap == broker.bootstrap


def test_an_internal_port_is_chosen_when_none_is_given(tmp_path: Path) -> None:
    broker = KafkaBroker(tmp_path, port=9092, advertised_port=19092)
    assert broker.internal_port not in (None, 9092, 19092)
    assert (
        f"INTERNAL://127.0.0.1:{broker.internal_port}"
        in (broker.server_properties(9093)["listeners"])
    )
