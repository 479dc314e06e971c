"""The restart strategy: an abortable Kafka error inside a batch's transaction restarts the query in
the running driver (no process restart), and the output stays exact; a fatal one stops at once."""

from __future__ import annotations

from ipcount.kafka.topics import ensure_topics


def test_an_abortable_error_restarts_the_query_in_process(
    make_settings, tmp_path, ipcount_cli, Feed
) -> None:  # type: ignore[no-untyped-def]
    settings = make_settings()
    ensure_topics(settings)
    feed = Feed(settings)
    feed.round(0, 30)
    # Every batch that writes anything fails once with an abortable error: two restarts.
    faults = ",".join(f"sink.before_commit@{b}/abort" for b in range(6))
    env = {
        "IPCOUNT_FAULTS": faults,
        "IPCOUNT_FAULTS_STATE": str(tmp_path),
        "IPCOUNT_JOB_RESTART_DELAY_SECONDS": "1",
    }
    done = ipcount_cli(settings, "run", "--available-now", "--close-all-windows", env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    restarts = [line for line in done.stderr.splitlines() if "restarting the query" in line]
    fired = sorted(p.name for p in tmp_path.glob("*.fired"))
    assert len(restarts) == len(fired) >= 1, (restarts, fired)
    assert "TransactionAbortedError" in restarts[0] or "aborted" in restarts[0], restarts[0]
    last = feed.verify(ipcount_cli, tmp_path)
    assert last.endswith("exact=true"), last


def test_restarts_are_bounded(make_settings, tmp_path, ipcount_cli, Feed) -> None:  # type: ignore[no-untyped-def]
    """job.restart_attempts = 0: the first failure ends the run with exit status 1."""
    settings = make_settings()
    ensure_topics(settings)
    Feed(settings).round(0, 30)
    env = {
        "IPCOUNT_FAULTS": ",".join(f"sink.before_commit@{b}/abort" for b in range(6)),
        "IPCOUNT_FAULTS_STATE": str(tmp_path),
        "IPCOUNT_JOB_RESTART_ATTEMPTS": "0",
    }
    done = ipcount_cli(settings, "run", "--available-now", "--close-all-windows", env=env)
    assert done.returncode == 1, done.stderr[-3000:]
    assert "failed after 0 restart(s)" in done.stderr, done.stderr[-3000:]
