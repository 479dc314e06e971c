"""No input can stop counting or hide a client: a record whose time is out of range among ordinary
records is dead-lettered with its reason while every other record is counted exactly, and a
~100 KB line a real nginx writes (8 KB request, referer and user agent of escaped bytes) and a
unix-socket client are counted like any other (real broker, real Spark, `ipcount run`)."""

from __future__ import annotations

from confluent_kafka import Producer

from ipcount.formats.accesslog import format_record
from ipcount.kafka.topic_reader import TopicReader
from ipcount.kafka.topics import ensure_topics

# A valid local time whose UTC instant is after 9999-12-31T23:59:59Z (used to raise OverflowError
# in the driver's heartbeat base and stop the job for good).
OUT_OF_RANGE = b'203.0.113.66 - - [31/Dec/9999:23:59:59 -0100] "GET / HTTP/1.1" 200 1 "-" "-"'


def test_an_out_of_range_time_is_dead_lettered_and_long_lines_count(
    make_settings, tmp_path, ipcount_cli, Feed
) -> None:  # type: ignore[no-untyped-def]
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
    producer = Producer({"bootstrap.servers": settings.kafka.bootstrap_servers})
    producer.produce(settings.topics.source, value=OUT_OF_RANGE, partition=0)
    producer.produce(settings.topics.source, value=long_line, partition=1)
    producer.produce(settings.topics.source, value=format_record("unix:", at).encode())
    assert producer.flush(30) == 0
    feed.ledger.add(at, "198.51.100.7")
    feed.ledger.add(at, "unix:")
    feed.round(10, 20)

    done = ipcount_cli(settings, "run", "--available-now", "--close-all-windows")
    assert done.returncode == 0, done.stderr[-3000:]

    with TopicReader(settings.kafka.to_librdkafka("consumer"), settings.topics.dead_letter) as r:
        dead = list(r.read_to_end(60))
    assert [d.value for d in dead] == [OUT_OF_RANGE]
    reason = dict(dead[0].headers or [])["ipcount.reason"]
    assert reason.startswith(b"malformed: event time outside"), reason
    last = feed.verify(ipcount_cli, tmp_path)
    assert last.endswith("exact=true"), last
