"""No input can stop counting or hide a client (real broker, real Spark, `ipcount run`), in one
run among ordinary records, each hostile record dead-lettered with its reason while every other
record is counted exactly:

- a record whose time is out of range is dead-lettered with its reason, and a ~100 KB line a real
  nginx writes (8 KB request, referer and user agent of escaped bytes) and a unix-socket client
  are counted like any other;
- no poison pills: a malformed record close to the broker's size limit is dead-lettered (cut,
  with its original size and where it is);
- no record stops a query through any field: a record with a ~1 MB key (legal for the broker)
  whose value is not an access line is dead-lettered with its key replaced by a digest and the
  cut said in a header (issue #38).
"""

from __future__ import annotations

import hashlib

from confluent_kafka import Producer

from ipcount.formats.accesslog import format_record
from ipcount.kafka.topic_reader import TopicReader
from ipcount.kafka.topics import ensure_topics

# A valid local time whose UTC instant is after 9999-12-31T23:59:59Z (used to raise OverflowError
# in the driver's heartbeat base and stop the job for good).
OUT_OF_RANGE = b'203.0.113.66 - - [31/Dec/9999:23:59:59 -0100] "GET / HTTP/1.1" 200 1 "-" "-"'
SIZE = 1_040_000  # above librdkafka's default message.max.bytes (1,000,000), below Kafka's limit
KEY_SIZE = 1_000_000  # legal under Kafka's default max.message.bytes (1,048,588)
NOT_A_LINE = b"malformed: not a valid nginx combined-format line"


def test_hostile_records_are_dead_lettered_and_everything_else_counts(
    make_settings, tmp_path, ipcount_cli, Feed
) -> None:  # type: ignore[no-untyped-def]
    # The three hostile records were three tests, each with its own run of the job; one run
    # shows each of them (each dead letter is told apart by where it came from).
    settings = make_settings()  # dead letters on by default
    assert settings.job.dead_letter
    ensure_topics(settings)
    feed = Feed(settings)
    feed.round(0, 10)
    at = feed.t0 + 10_000
    # What nginx writes for an 8 KB request line, Referer and User-Agent of bytes >= 0x7F (each
    # escaped as \xHH): about 100 KB, for one request that must be counted.
    long_line = format_record(
        "198.51.100.7",
        at,
        path="/search?q=" + "\\xC3\\xBC" * 1000,
        referer="https://example.com/" + "\\xE2\\x82\\xAC" * 2700,
        user_agent="Mozilla/5.0 " + "\\xF0\\x9F\\x98\\x80" * 2000,
        status=200,
    ).encode()
    assert len(long_line) > 90_000
    key = b"k" * (KEY_SIZE - 10) + b"0123456789"
    producer = Producer(
        {"bootstrap.servers": settings.kafka.bootstrap_servers, "message.max.bytes": 2_000_000}
    )
    producer.produce(settings.topics.source, value=OUT_OF_RANGE, partition=0)
    producer.produce(settings.topics.source, value=long_line, partition=1)
    producer.produce(settings.topics.source, value=format_record("unix:", at).encode())
    producer.produce(settings.topics.source, value=b"x" * SIZE, partition=0)
    producer.produce(settings.topics.source, key=key, value=b"not an access line", partition=0)
    assert producer.flush(60) == 0
    feed.ledger.add(at, "198.51.100.7")
    feed.ledger.add(at, "unix:")
    feed.round(10, 20)
    done = ipcount_cli(settings, "run", "--available-now", "--close-all-windows")
    assert done.returncode == 0, done.stderr[-3000:]
    last = feed.verify(ipcount_cli, tmp_path)  # every (window, IP) of the feed, exactly once
    assert last.endswith("exact=true"), last

    with TopicReader(settings.kafka.to_librdkafka("consumer"), settings.topics.dead_letter) as r:
        dead = list(r.read_to_end(60))
    # The three hostile records, no other, in the order they were produced to partition 0.
    assert len(dead) == 3, [(len(d.key or b""), len(d.value or b"")) for d in dead]
    headers = [dict(d.headers or []) for d in dead]
    assert all(
        h["ipcount.source"].startswith(f"{settings.topics.source}/0@".encode()) for h in headers
    ), headers
    dead.sort(key=lambda d: int(dict(d.headers or [])["ipcount.source"].rsplit(b"@", 1)[1]))
    out_of_range, large, keyed = dead
    # The out-of-range time.
    assert out_of_range.value == OUT_OF_RANGE
    reason = dict(out_of_range.headers or [])["ipcount.reason"]
    assert reason.startswith(b"malformed: event time outside"), reason
    # The 1,040,000-byte malformed record: cut, with its size and where it is.
    h = dict(large.headers or [])
    assert large.value == b"x" * settings.job.dead_letter_max_bytes
    assert h["ipcount.original.size"] == str(SIZE).encode()
    assert h["ipcount.reason"] == NOT_A_LINE
    # The ~1 MB key: replaced by its digest, the value (not cut) kept.
    h = dict(keyed.headers or [])
    assert keyed.key == b"sha256:" + hashlib.sha256(key).hexdigest().encode()
    assert h["ipcount.original.key.size"] == str(KEY_SIZE).encode()
    assert keyed.value == b"not an access line"
    assert "ipcount.original.size" not in h  # the value was not cut
    assert h["ipcount.reason"] == NOT_A_LINE
