"""No record stops a query through any field: a record with a ~1 MB key (legal for the broker)
whose value is not an access line is dead-lettered with its key replaced by a digest and the cut
said in a header, and the job counts the rest exactly (issue #38)."""

from __future__ import annotations

import hashlib

from confluent_kafka import Producer

from ipcount.kafka.topic_reader import TopicReader
from ipcount.kafka.topics import ensure_topics

KEY_SIZE = 1_000_000  # legal under Kafka's default max.message.bytes (1,048,588)


def test_a_record_with_a_1_mb_key_is_dead_lettered_and_the_rest_counted(
    make_settings, tmp_path, ipcount_cli, Feed
) -> None:  # type: ignore[no-untyped-def]
    settings = make_settings()
    ensure_topics(settings)
    feed = Feed(settings)
    feed.round(0, 3)  # 150 ordinary records
    key = b"k" * (KEY_SIZE - 10) + b"0123456789"
    producer = Producer(
        {"bootstrap.servers": settings.kafka.bootstrap_servers, "message.max.bytes": 2_000_000}
    )
    producer.produce(settings.topics.source, key=key, value=b"not an access line", partition=0)
    assert producer.flush(60) == 0
    feed.round(3, 6)  # 150 more

    done = ipcount_cli(settings, "run", "--available-now", "--close-all-windows")  # dead letters on
    assert done.returncode == 0, done.stderr[-3000:]

    assert sum(feed.ledger.counts.values()) == 300
    last = feed.verify(ipcount_cli, tmp_path)  # every (window, IP) of the 300, exactly once
    assert last.endswith("exact=true"), last
    with TopicReader(settings.kafka.to_librdkafka("consumer"), settings.topics.dead_letter) as r:
        dead = list(r.read_to_end(60))
    assert len(dead) == 1, [(len(d.key or b""), len(d.value or b"")) for d in dead]
    headers = dict(dead[0].headers or [])
    assert dead[0].key == b"sha256:" + hashlib.sha256(key).hexdigest().encode()
    assert headers["ipcount.original.key.size"] == str(KEY_SIZE).encode()
    assert dead[0].value == b"not an access line"
    assert "ipcount.original.size" not in headers  # the value was not cut
    assert headers["ipcount.reason"] == b"malformed: not a valid nginx combined-format line"
    assert headers["ipcount.source"].startswith(f"{settings.topics.source}/0@".encode())
