"""Every sink task writes its share of a micro-batch in its own Kafka transaction. Killed inside a task's transaction and between a task's commit and Spark's commit
log, the job still writes every (window, IP) exactly once; each partition's marker says what it
wrote and the query's marker sums them."""

from __future__ import annotations

import re

import pytest

from ipcount.chaos.processes import last_committed_batch
from ipcount.kafka.topics import ensure_topics
from ipcount.sink.runs import read_progress

pytestmark = pytest.mark.slow


def test_each_task_commits_its_share_once_through_kills(
    make_settings, tmp_path, ipcount_cli, Feed
) -> None:  # type: ignore[no-untyped-def]
    settings = make_settings()
    ensure_topics(settings)
    feed = Feed(settings)
    feed.round(0, 20)
    first = ipcount_cli(settings, "run", "--available-now")
    assert first.returncode == 0, first.stderr[-3000:]
    # The job's log says, per batch, what its sink tasks wrote and how long the slowest took
    # (logged where the driver's commit runs: one of Spark's Python workers).
    lines = re.findall(
        r"batch (\d+): (\d+) sink task\(s\) wrote (\d+) records .*slowest task: rows and encoding "
        r"[0-9.]+s, commit [0-9.]+s",
        first.stderr,
    )
    assert lines and sum(int(n) for _, _, n in lines) > 0, first.stderr[-3000:]

    # Killed after a task's own commit, before Spark's commit log records the batch; then
    # killed inside a task's open transaction.
    for second, point in ((20, "sink.after_commit"), (40, "sink.before_commit")):
        feed.round(second, second + 20)
        batch = (last_committed_batch(settings.job.checkpoint_location) or -1) + 1
        faults = ",".join(f"{point}@{b}" for b in range(batch, batch + 4))
        killed = ipcount_cli(
            settings,
            "run",
            "--available-now",
            env={"IPCOUNT_FAULTS": faults},
            own_group=True,
        )
        assert killed.returncode != 0, (point, killed.stderr[-3000:])

    final = ipcount_cli(settings, "run", "--available-now", "--close-all-windows")
    assert final.returncode == 0, final.stderr[-3000:]
    last = feed.verify(ipcount_cli, tmp_path)
    assert last.endswith("exact=true"), last

    # Both sink partitions committed in their own transactions; the query's marker is newest.
    view = read_progress(settings.kafka.to_librdkafka("consumer"), settings.topics.progress, 30)
    tasks = {p: m for (q, p), m in view.partitions.items() if m.topic == settings.topics.sink}
    assert sorted(tasks) == [0, 1], view.partitions
    assert all(
        m.transactional_id and m.transactional_id.endswith(f"-p{p}") for p, m in tasks.items()
    )
    query = next(m for m in view.markers.values() if m.topic == settings.topics.sink)
    assert max(m.batch_id for m in tasks.values()) <= query.batch_id
