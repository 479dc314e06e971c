"""The sink checks itself against Spark's checkpoint: a deleted checkpoint, a restored older one
and a broker that lost an acknowledged commit are refused with a clear message, never silently
duplicated or lost."""

from __future__ import annotations

import shutil
from pathlib import Path

from ipcount.kafka.topics import ensure_topics


def _ok(done) -> None:  # type: ignore[no-untyped-def]
    assert done.returncode == 0, done.stderr[-3000:]


def test_older_checkpoints_lost_commits_and_deleted_checkpoints_are_refused(
    make_settings, new_broker, tmp_path, ipcount_cli, Feed
) -> None:  # type: ignore[no-untyped-def]
    # One job history for the three refusals (each used to build its own with two runs): on a
    # broker of the test's own, whose disk can go back in time. After two bounded runs: a
    # restored older checkpoint is refused; a broker back from its disk of before the second run
    # is refused; then, everything as it was, the run goes on; the checkpoint is deleted, refused,
    # and continued by an explicit --new-query.
    broker = new_broker(tmp_path / "broker")
    broker.start(timeout=60)

    def broker_disk(keep: str | None = None, restore: str | None = None) -> None:
        """Stop the broker, copy its disk to `keep` and/or put `restore` back, start it again."""
        broker.stop()
        if keep:
            shutil.copytree(tmp_path / "broker", tmp_path / keep)
        if restore:
            shutil.rmtree(tmp_path / "broker")
            shutil.copytree(tmp_path / restore, tmp_path / "broker")
        broker.start(timeout=60)

    def checkpoint_from(copy: str | None) -> None:
        shutil.rmtree(checkpoint)
        if copy:
            shutil.copytree(tmp_path / copy, checkpoint)

    try:
        settings = make_settings(f"kafka.bootstrap_servers={broker.bootstrap}")
        ensure_topics(settings)
        feed = Feed(settings)
        checkpoint = Path(settings.job.checkpoint_location)
        feed.round(0, 20)
        _ok(ipcount_cli(settings, "run", "--available-now"))
        shutil.copytree(checkpoint, tmp_path / "older")
        broker_disk(keep="disk-before")  # the broker's disk, then
        feed.round(20, 40)
        _ok(ipcount_cli(settings, "run", "--available-now"))
        shutil.copytree(checkpoint, tmp_path / "newest")

        # A restored older checkpoint: refused.
        checkpoint_from("older")
        refused = ipcount_cli(settings, "run", "--available-now", "--close-all-windows")
        assert refused.returncode != 0
        assert "older than the sink's history" in refused.stderr, refused.stderr[-3000:]

        # The broker comes back from its older disk: the last commit it acknowledged is gone.
        checkpoint_from("newest")
        broker_disk(keep="disk-after", restore="disk-before")
        again = ipcount_cli(settings, "run", "--available-now")
        assert again.returncode != 0
        assert "lost" in again.stderr and "acknowledged" in again.stderr, again.stderr[-3000:]

        # Everything as it was (the newest checkpoint, the broker's newest disk): the run goes on.
        broker_disk(restore="disk-after")
        checkpoint_from("newest")
        _ok(ipcount_cli(settings, "run", "--available-now", "--close-all-windows"))

        # A deleted checkpoint: refused, and nothing written twice. The verify covers the run
        # above as well: the refused run wrote nothing, so exact=true says that run was exact.
        checkpoint_from(None)
        again = ipcount_cli(settings, "run", "--available-now", "--close-all-windows")
        assert again.returncode != 0
        assert "--new-query" in again.stderr and "already holds the output" in again.stderr, (
            again.stderr[-3000:]
        )
        last = feed.verify(ipcount_cli, tmp_path)
        assert last.endswith("exact=true"), last

        # The explicit choice: a new query that starts where the old one's output ends.
        _ok(ipcount_cli(settings, "run", "--available-now", "--close-all-windows", "--new-query"))
        feed.round(60, 70)
        _ok(ipcount_cli(settings, "run", "--available-now", "--close-all-windows"))
        last = feed.verify(ipcount_cli, tmp_path)
        assert last.endswith("exact=true") and " duplicates=0 " in last, last
    finally:
        broker.stop()
