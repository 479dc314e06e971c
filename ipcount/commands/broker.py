"""`ipcount broker start|stop|status`: the local broker (Apache Kafka or noida-db) for development
and the demo."""

from __future__ import annotations

import argparse
import dataclasses

from ipcount.commands import SubParsers, add_action_parser
from ipcount.config import Settings
from ipcount.local.broker import LocalBroker
from ipcount.local.kinds import BROKER_KINDS, configured_broker

__all__ = ["register", "ORDER"]

ORDER = 50


def register(sub: SubParsers) -> None:
    p = add_action_parser(
        sub,
        "broker",
        ["start", "stop", "status"],
        help="run the local development broker (Apache Kafka or noida-db)",
        description="Start, stop or check the local Kafka broker configured in [broker].",
    )
    p.add_argument(
        "--kind",
        choices=BROKER_KINDS,
        help="kafka (Apache Kafka, KRaft) or noida-db (JVM-free stand-in); default: broker.kind",
    )
    p.set_defaults(func=run)


def _broker(settings: Settings, kind: str | None) -> LocalBroker:
    if kind is not None:
        settings = dataclasses.replace(
            settings, broker=dataclasses.replace(settings.broker, kind=kind)
        )
    return configured_broker(settings)


def run(args: argparse.Namespace, settings: Settings) -> int:
    broker = _broker(settings, args.kind)
    if args.action == "start":
        pid = broker.start(timeout=settings.broker.start_timeout_seconds)
        print(
            f"{broker.kind} broker running: pid {pid}, bootstrap {broker.bootstrap}, "
            f"data dir {broker.data_dir}"
        )
        if settings.kafka.bootstrap_servers != broker.bootstrap:
            print(
                f"note: kafka.bootstrap_servers is {settings.kafka.bootstrap_servers}; "
                f"set IPCOUNT_KAFKA_BOOTSTRAP_SERVERS={broker.bootstrap} to use this broker"
            )
        return 0
    if args.action == "stop":
        stale = broker.stale_reason()
        if broker.stop():
            print(f"broker stopped (data kept in {broker.data_dir})")
        elif stale:
            print(f"nothing stopped: {stale}; removed the stale state file")
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
