"""Producing the sink's records into the open transaction (driver)."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

from ipcount.sink.txn_config import Record

__all__ = ["produce", "chain"]


def produce(
    producer: Any,
    topic: str,
    value: bytes | None,
    key: bytes | None,
    headers: list[tuple[str, bytes]] | None = None,
    on_delivery: Callable[[Any, Any], Any] | None = None,
) -> None:
    """Produce one record, waiting for room in the producer's local queue when it is full."""
    extra: dict[str, Any] = {}
    if headers:
        extra["headers"] = headers
    if on_delivery is not None:
        extra["on_delivery"] = on_delivery
    while True:
        try:
            producer.produce(topic, value, key, **extra)
            return
        except BufferError:
            # The local queue is full: let librdkafka send, then try again.
            producer.poll(0.05)


def chain(first: Record, rest: Iterable[Record]) -> Iterable[Record]:
    """`first`, then `rest`."""
    yield first
    yield from rest
