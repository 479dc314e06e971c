"""The process-wide transactional sessions of the sink (driver: the reused Python worker that runs
Spark's commits)."""

from __future__ import annotations

import threading

from ipcount.sink.txn import TxnSession
from ipcount.sink.txn_config import TxnConfig

__all__ = ["session_for", "abort_open_transaction"]

# Commits run in a reused Python process on the driver, while the writer object is rebuilt for
# every batch: the producer and the last committed batchId therefore live at module level.
_SESSIONS: dict[str, TxnSession] = {}
_LOCK = threading.Lock()


def session_for(config: TxnConfig) -> TxnSession:
    """The process-wide session for `config.transactional_id` (replaced if the config changed)."""
    with _LOCK:
        current = _SESSIONS.get(config.transactional_id)
        if current is None or current.config != config:
            if current is not None:
                current.close()
            current = TxnSession(config)
            _SESSIONS[config.transactional_id] = current
        return current


def abort_open_transaction(transactional_id: str, batch_id: int) -> bool:
    """Abort the process-wide session's open transaction, if it has one."""
    with _LOCK:
        session = _SESSIONS.get(transactional_id)
    return session is not None and session.abort_open(batch_id)
