"""The process-wide sink sessions, one per transactional.id, kept warm across micro-batches in
the Python process that commits (the driver's for the query's marker; each executor's for its sink
tasks)."""

from __future__ import annotations

import threading
from collections import OrderedDict

from ipcount.sink.producer_config import TxnConfig
from ipcount.sink.transaction import TxnSession

__all__ = ["MAX_SESSIONS", "abort_open_transaction", "session_for"]

# Commits run in reused Python processes (the driver's and the executors'), while the writer
# object is rebuilt for every batch: the producers and the last committed batchIds therefore live
# at module level, kept warm across batches.
_SESSIONS: OrderedDict[str, TxnSession] = OrderedDict()
_LOCK = threading.Lock()
# A Python worker may serve many sink partitions over time: it keeps the producers of the ones
# it served last (each holds connections and threads); an older one is closed between batches,
# and initialised again (fencing nothing but itself) should that partition come back.
MAX_SESSIONS = 8


def session_for(config: TxnConfig) -> TxnSession:
    """The process-wide session for `config.transactional_id` (replaced if the config changed)."""
    with _LOCK:
        current = _SESSIONS.get(config.transactional_id)
        if current is None or current.config != config:
            if current is not None:
                current.close()
            current = TxnSession(config)
            _SESSIONS[config.transactional_id] = current
        _SESSIONS.move_to_end(config.transactional_id)
        while len(_SESSIONS) > MAX_SESSIONS:
            _, oldest = _SESSIONS.popitem(last=False)
            oldest.close()
        return current


def abort_open_transaction(transactional_id: str, batch_id: int) -> bool:
    """Abort the process-wide session's open transaction, if it has one."""
    with _LOCK:
        session = _SESSIONS.get(transactional_id)
    return session is not None and session.abort_open(batch_id)
