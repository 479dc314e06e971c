"""An Apache Kafka broker whose clients all go through a fault proxy (advertised listener), while
clients on its internal listener do not: a blackhole stops the first kind and not the second."""

from __future__ import annotations

import time
from pathlib import Path

from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, NewTopic

from ipcount.kafka.client import wait_for_metadata
from ipcount.local.broker import free_port
from ipcount.local.fault_proxy import FaultProxy
from ipcount.local.kraft import KafkaBroker


def test_every_client_connection_goes_through_the_proxy(tmp_path: Path) -> None:
    port = free_port()
    with FaultProxy("127.0.0.1", port) as proxy:
        broker = KafkaBroker(tmp_path, port=port, advertised_port=proxy.port)
        broker.start(timeout=60)
        try:
            md = wait_for_metadata({"bootstrap.servers": proxy.address}, timeout=30)
            assert [(b.host, b.port) for b in md.brokers.values()] == [("127.0.0.1", proxy.port)]
            direct = wait_for_metadata({"bootstrap.servers": broker.internal_bootstrap}, 30)
            assert [b.port for b in direct.brokers.values()] == [broker.internal_port]

            admin = AdminClient({"bootstrap.servers": broker.internal_bootstrap})
            admin.create_topics([NewTopic("t", 1, 1)])["t"].result(30)
            via_proxy = Producer({"bootstrap.servers": proxy.address, "linger.ms": 0})
            via_proxy.produce("t", b"first")
            assert via_proxy.flush(30) == 0
            sent_before = proxy.figures().bytes_up

            proxy.blackhole()
            via_proxy.produce("t", b"held")
            assert via_proxy.flush(3) == 1  # the leader connection is held too
            bypass = Producer({"bootstrap.servers": broker.internal_bootstrap, "linger.ms": 0})
            bypass.produce("t", b"direct")
            assert bypass.flush(30) == 0  # the broker itself is fine
            proxy.heal()
            t0 = time.monotonic()
            assert via_proxy.flush(30) == 0
            assert time.monotonic() - t0 < 10
            assert proxy.figures().bytes_up > sent_before
        finally:
            broker.stop()
