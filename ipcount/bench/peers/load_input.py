#!/usr/bin/env python3
"""Input generator + ground truth for the per-IP 5 s tumbling-window benchmark.

  load_input.py load --n 1000000 --workdir W   create topics, pre-load N main records,
                                        write W/truth.csv and W/meta.json
  load_input.py tail --workdir W               append the "tail" records that push event
                                        time far enough to close every real window

Records are nginx "combined" lines, e.g.
  203.0.113.7 - - [22/Nov/2026:07:20:01 +0000] "GET /index.html HTTP/1.1" 200 612 "-" "Mozilla/5.0"
Event time = the [..] field (1 s resolution); the Kafka message timestamp is set
to the same value.  Event time advances by 1 s every --rate records (global
order), so each 5 s window holds 5*rate records.  Client IPs are drawn from
--ips distinct addresses with a Zipf(s) skew (seeded, deterministic).

Partitioning (--key-mode):
  none (default): null key, record i -> partition i % P   (log-shipper style;
                  every partition is in event-time order; a per-IP job must shuffle)
  ip            : key = IP, partition = crc32(ip) % P     (pre-partitioned by IP)

Ground truth (truth.csv): window_start_ms,ip,count for every (5 s window, ip) of
the N main records.  Tail records use 198.51.100.0/24 IPs, which never occur in
the main data, so their (never-closing) windows are not part of the truth.
"""

import argparse
import bisect
import calendar
import itertools
import json
import os
import random
import sys
import time
import zlib
from collections import Counter

from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

__all__ = ["main"]

MONTHS = ["Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec"]
PATHS = [
    "/",
    "/index.html",
    "/api/v1/items",
    "/api/v1/items/42",
    "/login",
    "/static/app.js",
    "/static/app.css",
    "/img/logo.png",
    "/favicon.ico",
    "/search?q=kafka",
    "/cart",
    "/checkout",
]
METHODS = ["GET"] * 8 + ["POST", "HEAD"]
STATUSES = [200] * 16 + [304, 301, 404, 500]
AGENTS = [
    "Mozilla/5.0",
    "curl/8.5.0",
    "Mozilla/5.0 (X11; Linux x86_64) AppleWebKit/537.36 (KHTML, like Gecko) "
    "Chrome/131.0 Safari/537.36",
    "Mozilla/5.0 (iPhone; CPU iPhone OS 17_1 like Mac OS X) AppleWebKit/605.1.15",
    "Googlebot/2.1 (+http://www.google.com/bot.html)",
]
TAIL_RECORDS = 96  # distinct tail IPs 198.51.100.1..96
WINDOW_MS = 5000
GRACE_MS = 5000


def clf_time(sec):
    t = time.gmtime(sec)
    month = MONTHS[t.tm_mon - 1]
    return (
        f"{t.tm_mday:02d}/{month}/{t.tm_year:04d}:{t.tm_hour:02d}:{t.tm_min:02d}:{t.tm_sec:02d}"
        " +0000"
    )


def make_ips(n, rng):
    ips, seen = [], set()
    while len(ips) < n:
        a = rng.randint(1, 223)
        if a in (10, 127, 198):  # keep 198.51.100.0/24 free for the tail
            continue
        ip = f"{a}.{rng.randint(0, 255)}.{rng.randint(0, 255)}.{rng.randint(1, 254)}"
        if ip not in seen:
            seen.add(ip)
            ips.append(ip)
    return ips


def partition_for(i, ip, key_mode, parts):
    if key_mode == "ip":
        return zlib.crc32(ip.encode()) % parts
    return i % parts


def high_watermarks(bootstrap, topic, parts):
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": "gen-watermarks"})
    try:
        return [
            c.get_watermark_offsets(TopicPartition(topic, p), timeout=10)[1] for p in range(parts)
        ]
    finally:
        c.close()


def producer(bootstrap):
    return Producer(
        {
            "bootstrap.servers": bootstrap,
            "enable.idempotence": True,
            "linger.ms": 20,
            "batch.num.messages": 10000,
            "queue.buffering.max.messages": 500000,
            "compression.type": "none",
        }
    )


def produce_all(p, topic, records):
    """records: iterable of (partition, key|None, value bytes, ts_ms)."""
    n = 0
    for part, key, value, ts in records:
        while True:
            try:
                p.produce(topic, value=value, key=key, partition=part, timestamp=ts)
                break
            except BufferError:
                p.poll(0.05)
        n += 1
        if n % 20000 == 0:
            p.poll(0)
    left = p.flush(60)
    if left:
        sys.exit(f"gen: {left} records not delivered")
    return n


def cmd_load(a):
    os.makedirs(a.workdir, exist_ok=True)
    rng = random.Random(a.seed)
    ips = make_ips(a.ips, rng)
    weights = list(itertools.accumulate(1.0 / (r**a.zipf_s) for r in range(1, a.ips + 1)))
    start = calendar.timegm(time.strptime(a.start, "%Y-%m-%dT%H:%M:%SZ"))

    admin = AdminClient({"bootstrap.servers": a.bootstrap})
    futs = admin.create_topics(
        [NewTopic(a.topic, a.partitions, 1), NewTopic(a.out_topic, a.partitions, 1)]
    )
    for t, f in futs.items():
        try:
            f.result()
        except Exception as e:  # noqa: BLE001
            sys.exit(f"gen: cannot create topic {t}: {e}")

    truth = Counter()
    total = weights[-1]
    # pre-draw the non-IP parts of the line (cheap variety, deterministic)
    tails = [
        f'"{rng.choice(METHODS)} {rng.choice(PATHS)} HTTP/1.1" {rng.choice(STATUSES)} '
        f'{rng.randint(0, 60000)} "-" "{rng.choice(AGENTS)}"'
        for _ in range(4096)
    ]

    def records():
        cur_sec, stamp = None, None
        for i in range(a.n):
            sec = start + i // a.rate
            if sec != cur_sec:
                cur_sec, stamp = sec, clf_time(sec)
            ip = ips[bisect.bisect_left(weights, rng.random() * total)]
            ts = sec * 1000
            truth[(ts - ts % WINDOW_MS, ip)] += 1
            line = f"{ip} - - [{stamp}] {tails[i & 4095]}"
            key = ip.encode() if a.key_mode == "ip" else None
            yield partition_for(i, ip, a.key_mode, a.partitions), key, line.encode(), ts

    t0 = time.time()
    n = produce_all(producer(a.bootstrap), a.topic, records())
    dt = time.time() - t0

    last_ts = (start + (a.n - 1) // a.rate) * 1000
    last_window_end = last_ts - last_ts % WINDOW_MS + WINDOW_MS
    # event time of the tail: closes every real window even for engines whose
    # watermark lags the max timestamp by (grace + 1 window)
    tail_ts = last_window_end + GRACE_MS + 2 * WINDOW_MS
    with open(os.path.join(a.workdir, "truth.csv"), "w") as f:
        f.write("window_start_ms,ip,count\n")
        for (ws, ip), c in sorted(truth.items()):
            f.write(f"{ws},{ip},{c}\n")
    # end offsets of the main data per partition (what a consumer must reach)
    ends = high_watermarks(a.bootstrap, a.topic, a.partitions)
    meta = {
        "n": n,
        "topic": a.topic,
        "out_topic": a.out_topic,
        "partitions": a.partitions,
        "key_mode": a.key_mode,
        "rate": a.rate,
        "ips": a.ips,
        "zipf_s": a.zipf_s,
        "seed": a.seed,
        "first_ts": start * 1000,
        "last_ts": last_ts,
        "tail_ts": tail_ts,
        "tail_records": TAIL_RECORDS,
        "window_ms": WINDOW_MS,
        "grace_ms": GRACE_MS,
        "results_expected": len(truth),
        "distinct_ips_seen": len({ip for _, ip in truth}),
        "windows": len({ws for ws, _ in truth}),
        "load_seconds": round(dt, 2),
    }
    meta["main_end_offsets"] = {str(p): ends[p] for p in range(a.partitions)}
    with open(os.path.join(a.workdir, "meta.json"), "w") as f:
        json.dump(meta, f, indent=1)
    print(
        f"gen: loaded {n} records into {a.topic} ({a.partitions} partitions, key={a.key_mode}) "
        f"in {dt:.1f}s; {meta['windows']} windows, {len(truth)} expected results"
    )


def cmd_tail(a):
    meta = json.load(open(os.path.join(a.workdir, "meta.json")))
    ts = meta["tail_ts"]
    stamp = clf_time(ts // 1000)
    recs = []
    for j in range(meta["tail_records"]):
        ip = f"198.51.100.{j + 1}"
        line = f'{ip} - - [{stamp}] "GET /tail HTTP/1.1" 200 0 "-" "tail"'
        key = ip.encode() if meta["key_mode"] == "ip" else None
        recs.append(
            (partition_for(j, ip, meta["key_mode"], meta["partitions"]), key, line.encode(), ts)
        )
    if len({r[0] for r in recs}) != meta["partitions"]:
        sys.exit("gen: tail records do not cover every partition")
    n = produce_all(producer(a.bootstrap), meta["topic"], recs)
    print(f"gen: appended {n} tail records at event time {ts}", file=sys.stderr)


def main():
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    sub = ap.add_subparsers(dest="cmd", required=True)
    for name in ("load", "tail"):
        s = sub.add_parser(name)
        s.add_argument("--bootstrap", default="127.0.0.1:49092")
        s.add_argument("--workdir", required=True)
        if name == "load":
            s.add_argument("--n", type=int, default=1_000_000)
            s.add_argument("--topic", default="access-log")
            s.add_argument("--out-topic", default="ip-counts")
            s.add_argument("--partitions", type=int, default=3)
            s.add_argument("--ips", type=int, default=2000)
            s.add_argument("--zipf-s", type=float, default=1.0)
            s.add_argument(
                "--rate", type=int, default=20000, help="records per second of event time"
            )
            s.add_argument("--start", default="2026-11-22T07:20:00Z")
            s.add_argument("--seed", type=int, default=42)
            s.add_argument("--key-mode", choices=["none", "ip"], default="none")
    a = ap.parse_args()
    (cmd_load if a.cmd == "load" else cmd_tail)(a)


if __name__ == "__main__":
    main()
