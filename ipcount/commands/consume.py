"""`ipcount consume`: the downstream consumer of topics.sink (read_committed by default)."""

from __future__ import annotations

import argparse
import dataclasses
import datetime as dt
import json
import sys
from typing import Any

from ipcount.config import Settings
from ipcount.formats.avro import make_codec
from ipcount.kafka.consume import TopicReader, decode_records

__all__ = ["register", "run", "ORDER"]

ORDER = 20

_HEADER = (
    f"{'window_start':24} {'window_end':24} {'ip':39} {'count':>8} {'partition':>9} {'offset':>10}"
)


def register(sub: Any) -> None:
    p = sub.add_parser(
        "consume",
        help="print the results in the sink topic as a read_committed consumer sees them",
        description="Read topics.sink, decode the Avro IpCount records and print them. "
        "Reads with isolation.level=read_committed (only committed transactions) unless "
        "--read-uncommitted is given, which also shows records of aborted transactions.",
    )
    p.add_argument(
        "--from-beginning",
        action="store_true",
        help="start at the earliest offsets (default: only new records)",
    )
    p.add_argument(
        "--read-uncommitted",
        action="store_true",
        help="isolation.level=read_uncommitted: also show open and aborted transactions' records",
    )
    p.add_argument(
        "--json", action="store_true", help="print one JSON object per line instead of a table"
    )
    p.add_argument(
        "--idle-exit",
        type=float,
        default=None,
        metavar="SECONDS",
        help="exit after this long without records (default: run until Ctrl-C)",
    )
    p.add_argument(
        "--max-records", type=int, default=None, metavar="N", help="exit after N records"
    )
    p.set_defaults(func=run)


def _iso(ms: int) -> str:
    return (
        dt.datetime.fromtimestamp(ms / 1000, tz=dt.UTC).strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3] + "Z"
    )


def run(args: argparse.Namespace, settings: Settings) -> int:
    isolation = "read_uncommitted" if args.read_uncommitted else "read_committed"
    codec = make_codec(
        settings.sink.wire_format, settings.sink.schema_registry_url, settings.topics.sink
    )
    out = sys.stdout
    if not args.json:
        print(_HEADER, file=out, flush=True)
    with TopicReader(
        settings.kafka.to_librdkafka("consumer"),
        settings.topics.sink,
        isolation=isolation,
        from_beginning=args.from_beginning,
        timeout=settings.kafka.connect_timeout_seconds,
    ) as reader:
        records = reader.follow(idle_exit=args.idle_exit, max_records=args.max_records)
        for rec, ip_count in decode_records(records, codec):
            if args.json:
                row = {
                    **dataclasses.asdict(ip_count),
                    "partition": rec.partition,
                    "offset": rec.offset,
                }
                print(json.dumps(row), file=out, flush=True)
            else:
                print(
                    f"{_iso(ip_count.window_start):24} {_iso(ip_count.window_end):24} "
                    f"{ip_count.ip:39} {ip_count.count:>8} {rec.partition:>9} {rec.offset:>10}",
                    file=out,
                    flush=True,
                )
    return 0
