"""The process-wide sink sessions: kept warm across batches, a bounded number per Python worker
(one worker may serve many sink partitions over time)."""

from __future__ import annotations

from ipcount.sink import sessions
from ipcount.sink.producer_config import TxnConfig
from ipcount.sink.task_commit import task_config


def _config() -> TxnConfig:
    return TxnConfig(
        topic="sink",
        progress_topic="progress",
        query_id="q1",
        transactional_id="ipcount-q1",
        producer_conf={"bootstrap.servers": "127.0.0.1:1"},
    )


def test_a_worker_keeps_the_sessions_it_served_last() -> None:
    base = _config()
    first = sessions.session_for(task_config(base, 0))
    assert sessions.session_for(task_config(base, 0)) is first
    others = [sessions.session_for(task_config(base, p)) for p in range(1, 20)]
    assert len(sessions._SESSIONS) == sessions.MAX_SESSIONS
    assert sessions.session_for(task_config(base, 19)) is others[-1]
    # Partition 0 was served longest ago: its session was closed; it comes back as a new one.
    again = sessions.session_for(task_config(base, 0))
    assert again is not first and again.config.transactional_id == "ipcount-q1-p0"
