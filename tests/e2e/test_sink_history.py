"""The sink checks itself against Spark's checkpoint: a deleted checkpoint, a restored older one
and a broker that lost an acknowledged commit are refused with a clear message, never silently
duplicated or lost."""

from __future__ import annotations

import shutil
from pathlib import Path

from ipcount.kafka.topics import ensure_topics


def _ok(done) -> None:  # type: ignore[no-untyped-def]
    assert done.returncode == 0, done.stderr[-3000:]


def test_a_deleted_checkpoint_is_refused_then_continued_with_new_query(
    make_settings, tmp_path, ipcount_cli, Feed
) -> None:  # type: ignore[no-untyped-def]
    settings = make_settings()
    ensure_topics(settings)
    feed = Feed(settings)
    feed.round(0, 20)
    _ok(ipcount_cli(settings, "run", "--available-now", "--close-all-windows"))
    shutil.rmtree(settings.job.checkpoint_location)

    again = ipcount_cli(settings, "run", "--available-now", "--close-all-windows")
    assert again.returncode != 0
    assert "--new-query" in again.stderr and "already holds the output" in again.stderr, (
        again.stderr[-3000:]
    )
    assert feed.verify(ipcount_cli, tmp_path).endswith("exact=true")  # nothing written twice

    # The explicit choice: a new query that starts where the old one's output ends.
    _ok(ipcount_cli(settings, "run", "--available-now", "--close-all-windows", "--new-query"))
    feed.round(60, 70)
    _ok(ipcount_cli(settings, "run", "--available-now", "--close-all-windows"))
    last = feed.verify(ipcount_cli, tmp_path)
    assert last.endswith("exact=true") and " duplicates=0 " in last, last


def test_a_restored_older_checkpoint_is_refused(make_settings, tmp_path, ipcount_cli, Feed) -> None:  # type: ignore[no-untyped-def]
    settings = make_settings()
    ensure_topics(settings)
    feed = Feed(settings)
    checkpoint = Path(settings.job.checkpoint_location)
    feed.round(0, 20)
    _ok(ipcount_cli(settings, "run", "--available-now"))
    shutil.copytree(checkpoint, tmp_path / "older")
    feed.round(20, 40)
    _ok(ipcount_cli(settings, "run", "--available-now"))
    shutil.copytree(checkpoint, tmp_path / "newest")

    shutil.rmtree(checkpoint)
    shutil.copytree(tmp_path / "older", checkpoint)
    refused = ipcount_cli(settings, "run", "--available-now", "--close-all-windows")
    assert refused.returncode != 0
    assert "older than the sink's history" in refused.stderr, refused.stderr[-3000:]

    shutil.rmtree(checkpoint)
    shutil.copytree(tmp_path / "newest", checkpoint)
    _ok(ipcount_cli(settings, "run", "--available-now", "--close-all-windows"))
    last = feed.verify(ipcount_cli, tmp_path)
    assert last.endswith("exact=true"), last


def test_a_broker_that_lost_a_committed_batch_is_detected_at_the_next_start(
    make_settings, new_broker, tmp_path, ipcount_cli, Feed
) -> None:  # type: ignore[no-untyped-def]
    broker = new_broker(tmp_path / "broker")
    broker.start(timeout=60)
    try:
        settings = make_settings(f"kafka.bootstrap_servers={broker.bootstrap}")
        ensure_topics(settings)
        feed = Feed(settings)
        feed.round(0, 20)
        _ok(ipcount_cli(settings, "run", "--available-now"))
        broker.stop()
        shutil.copytree(tmp_path / "broker", tmp_path / "before")  # the broker's disk, then
        broker.start(timeout=60)
        feed.round(20, 40)
        _ok(ipcount_cli(settings, "run", "--available-now"))
        # The broker comes back from its older disk: the last commit it acknowledged is gone.
        broker.stop()
        shutil.rmtree(tmp_path / "broker")
        shutil.copytree(tmp_path / "before", tmp_path / "broker")
        broker.start(timeout=60)
        again = ipcount_cli(settings, "run", "--available-now")
        assert again.returncode != 0
        assert "lost" in again.stderr and "acknowledged" in again.stderr, again.stderr[-3000:]
    finally:
        broker.stop()
