"""Fixtures of the source's broker-backed tests."""

from __future__ import annotations

import uuid
from collections.abc import Callable

import pytest
from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, NewTopic

from ipcount.kafka.client import with_client_logging


@pytest.fixture
def topic_with(bootstrap: str) -> Callable[[list[bytes]], str]:
    """`topic_with(values)`: a new one-partition topic holding `values` in order; its name."""

    def make(values: list[bytes]) -> str:
        name = f"src-{uuid.uuid4().hex[:10]}"
        admin = AdminClient(with_client_logging({"bootstrap.servers": bootstrap}))
        for fut in admin.create_topics([NewTopic(name, 1, 1)]).values():
            fut.result(timeout=30)
        producer = Producer(with_client_logging({"bootstrap.servers": bootstrap, "linger.ms": 5}))
        for value in values:
            try:
                producer.produce(name, value=value, partition=0)
            except BufferError:  # the local queue is full: let deliveries drain it
                producer.flush(30)
                producer.produce(name, value=value, partition=0)
        assert producer.flush(30) == 0
        return name

    return make
