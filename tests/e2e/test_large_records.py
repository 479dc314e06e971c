"""No poison pills: a malformed record close to the broker's size limit is dead-lettered (cut, with
its original size and where it is), and the job goes on, exactly."""

from __future__ import annotations

from confluent_kafka import Producer

from ipcount.kafka.topic_reader import TopicReader
from ipcount.kafka.topics import ensure_topics

SIZE = 1_040_000  # above librdkafka's default message.max.bytes (1,000,000), below Kafka's limit


def test_a_1040000_byte_malformed_record_is_dead_lettered(
    make_settings, tmp_path, ipcount_cli, Feed
) -> None:  # type: ignore[no-untyped-def]
    settings = make_settings()
    ensure_topics(settings)
    feed = Feed(settings)
    feed.round(0, 10)
    producer = Producer(
        {"bootstrap.servers": settings.kafka.bootstrap_servers, "message.max.bytes": 2_000_000}
    )
    producer.produce(settings.topics.source, value=b"x" * SIZE, partition=0)
    assert producer.flush(60) == 0
    feed.round(10, 20)

    done = ipcount_cli(settings, "run", "--available-now", "--close-all-windows")  # dead letters on
    assert done.returncode == 0, done.stderr[-3000:]

    with TopicReader(settings.kafka.to_librdkafka("consumer"), settings.topics.dead_letter) as r:
        dead = list(r.read_to_end(60))
    assert len(dead) == 1, [len(d.value or b"") for d in dead]
    headers = dict(dead[0].headers or [])
    assert dead[0].value == b"x" * settings.job.dead_letter_max_bytes
    assert headers["ipcount.original.size"] == str(SIZE).encode()
    assert headers["ipcount.source"].startswith(f"{settings.topics.source}/0@".encode())
    assert headers["ipcount.reason"] == b"malformed: not a valid nginx combined-format line"
    last = feed.verify(ipcount_cli, tmp_path)
    assert last.endswith("exact=true"), last
