"""`ipcount consume`: the downstream consumer of topics.sink (read_committed by default), with
`--with-late` also of topics.late, showing corrected totals."""

from __future__ import annotations

import argparse
import dataclasses
import datetime as dt
import json
import sys
import time
from collections import Counter
from collections.abc import Iterator
from typing import TextIO

from ipcount.commands import SubParsers
from ipcount.config import Settings
from ipcount.formats.avro import IpCount, make_codec
from ipcount.kafka.records import SinkRecord, decode_records
from ipcount.kafka.topic_reader import TopicReader

__all__ = ["register", "run"]


_HEADER = (
    f"{'window_start':24} {'window_end':24} {'ip':39} {'count':>8} {'partition':>9} {'offset':>10}"
)
_LATE_HEADER = (
    f"{'window_start':24} {'window_end':24} {'ip':39} {'kind':>5} {'count':>8} {'total':>8}"
)


def register(sub: SubParsers) -> None:
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
    p.add_argument(
        "--with-late",
        action="store_true",
        help="also read the late-count corrections (topics.late): each row says whether it is a "
        "window's final count or a correction, and the corrected total so far",
    )
    p.set_defaults(func=run)


def _iso(ms: int) -> str:
    return (
        dt.datetime.fromtimestamp(ms / 1000, tz=dt.UTC).strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3] + "Z"
    )


def _emit(
    out: TextIO, as_json: bool, ip_count: IpCount, fields: dict[str, object], columns: str
) -> None:
    """One result: a JSON object (the record's fields, then `fields`), or a table line (window,
    IP, then `columns`)."""
    if as_json:
        print(json.dumps({**dataclasses.asdict(ip_count), **fields}), file=out, flush=True)
    else:
        print(
            f"{_iso(ip_count.window_start):24} {_iso(ip_count.window_end):24} "
            f"{ip_count.ip:39} {columns}",
            file=out,
            flush=True,
        )


def run(args: argparse.Namespace, settings: Settings) -> int:
    if args.with_late:
        return _run_with_late(args, settings)
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
            _emit(
                out,
                args.json,
                ip_count,
                {"partition": rec.partition, "offset": rec.offset},
                f"{ip_count.count:>8} {rec.partition:>9} {rec.offset:>10}",
            )
    return 0


def _follow_both(
    readers: list[TopicReader], idle_exit: float | None, max_records: int | None
) -> Iterator[SinkRecord]:
    """Tail several topics in turn (each poll short), with `follow`'s exit rules."""
    seen = 0
    last = time.monotonic()
    while max_records is None or seen < max_records:
        got = False
        for reader in readers:
            for rec in reader.poll(timeout=0.2):
                got = True
                seen += 1
                yield rec
                if max_records is not None and seen >= max_records:
                    return
        now = time.monotonic()
        if got:
            last = now
        elif idle_exit is not None and now - last >= idle_exit:
            return


def _run_with_late(args: argparse.Namespace, settings: Settings) -> int:
    isolation = "read_uncommitted" if args.read_uncommitted else "read_committed"
    sink, late = settings.topics.sink, settings.topics.late
    codecs = {
        name: make_codec(settings.sink.wire_format, settings.sink.schema_registry_url, name)
        for name in (sink, late)
    }
    conf = settings.kafka.to_librdkafka("consumer")
    timeout = settings.kafka.connect_timeout_seconds
    out = sys.stdout
    if not args.json:
        print(_LATE_HEADER, file=out, flush=True)
    totals: Counter[tuple[int, str]] = Counter()
    with (
        TopicReader(
            conf, sink, isolation=isolation, from_beginning=args.from_beginning, timeout=timeout
        ) as results,
        TopicReader(
            conf,
            late,
            isolation=isolation,
            from_beginning=args.from_beginning,
            timeout=timeout,
            topic_setting="topics.late",
        ) as corrections,
    ):
        for rec in _follow_both([results, corrections], args.idle_exit, args.max_records):
            ((_, ip_count),) = decode_records([rec], codecs[rec.topic])
            kind = "late" if rec.topic == late else "final"
            key = (ip_count.window_start, ip_count.ip)
            totals[key] += ip_count.count
            _emit(
                out,
                args.json,
                ip_count,
                {
                    "kind": kind,
                    "total": totals[key],
                    "topic": rec.topic,
                    "partition": rec.partition,
                    "offset": rec.offset,
                },
                f"{kind:>5} {ip_count.count:>8} {totals[key]:>8}",
            )
    return 0
