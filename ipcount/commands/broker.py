"""`ipcount broker start|stop|status`: the local noida-db broker for development and the demo."""

from __future__ import annotations

import argparse
from typing import Any

from ipcount.config import Settings
from ipcount.local.broker import LocalBroker

__all__ = ["register", "ORDER"]

ORDER = 50


def register(sub: Any) -> None:
    p = sub.add_parser(
        "broker",
        help="run the local development broker (noida-db)",
        description="Start, stop or check the local noida-db Kafka broker configured in [broker].",
    )
    p.add_argument("action", choices=["start", "stop", "status"])
    p.set_defaults(func=run)


def _broker(settings: Settings) -> LocalBroker:
    b = settings.broker
    return LocalBroker(b.data_dir, b.host, b.port)


def run(args: argparse.Namespace, settings: Settings) -> int:
    broker = _broker(settings)
    if args.action == "start":
        pid = broker.start(timeout=settings.broker.start_timeout_seconds)
        print(
            f"broker running: pid {pid}, bootstrap {broker.bootstrap}, data dir {broker.data_dir}"
        )
        if settings.kafka.bootstrap_servers != broker.bootstrap:
            print(
                f"note: kafka.bootstrap_servers is {settings.kafka.bootstrap_servers}; "
                f"set IPCOUNT_KAFKA_BOOTSTRAP_SERVERS={broker.bootstrap} to use this broker"
            )
        return 0
    if args.action == "stop":
        if broker.stop():
            print(f"broker stopped (data kept in {broker.data_dir})")
        else:
            print(f"no broker running for data dir {broker.data_dir}")
        return 0
    status = broker.status()
    if status.running:
        print(
            f"running: pid {status.pid}, bootstrap {status.bootstrap}, data dir {status.data_dir}"
        )
        return 0
    print(f"not running (data dir {status.data_dir})")
    return 3
