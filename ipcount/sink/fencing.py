"""Who may write with a query's transactional.id (driver): ending what a crashed predecessor left
open before a job starts, and telling a fenced writer whether a newer start has taken over. The
order of starts is the broker's log order of run announcements (sink.runs), never a clock."""

from __future__ import annotations

import logging
from concurrent.futures import ThreadPoolExecutor

from confluent_kafka import KafkaException, Producer

from ipcount.errors import SinkError
from ipcount.kafka.client import describe_kafka_error, with_client_logging
from ipcount.kafka.kept_readers import KeptReaders
from ipcount.sink.producer_config import TxnConfig
from ipcount.sink.runs import ProgressView, read_progress

__all__ = ["FENCE_CONCURRENCY", "fence_predecessors", "superseded_by"]

logger = logging.getLogger(__name__)


def superseded_by(
    cfg: TxnConfig, seen: ProgressView | None = None, readers: KeptReaders | None = None
) -> str | None:
    """The run id of a start announced after `cfg.run_id` that has committed the query's newest
    batch; None when this start may go on (the fencer was another worker of this job, or a newer
    start that has committed nothing and may be gone). `seen`: a view of the progress topic this
    session read before, to continue, and `readers` the consumers to read it with
    (sink.runs.read_progress)."""
    if not cfg.run_id:
        return None
    seen = read_progress(
        cfg.consumer_conf, cfg.progress_topic, cfg.retry_deadline_seconds, view=seen,
        readers=readers,
    )  # fmt: skip
    order = seen.runs.get(cfg.query_id, [])
    if not order or order[-1] == cfg.run_id:
        return None
    newest = seen.markers.get(cfg.query_id)
    theirs = "" if newest is None else newest.run_id
    if theirs == cfg.run_id or theirs not in order:
        return None  # the newest commit is this start's own, or of a start older than both
    if cfg.run_id in order and order.index(theirs) < order.index(cfg.run_id):
        return None  # the newest commit is of an older start than this one
    return theirs


# How many transactional ids are initialised at once: each init_transactions is a few round trips
# to its coordinator (and waits for a predecessor's open transaction to be aborted), so a job with
# 2 x (1 + shuffle partitions) ids starts in about the time of the slowest, not of their sum.
FENCE_CONCURRENCY = 16


def fence_predecessors(
    producer_conf: dict[str, str],
    transactional_ids: list[str],
    transaction_timeout_ms: int,
    deadline_seconds: float,
) -> None:
    """init_transactions once for each id, from the driver, before a job reads the progress
    topic: a predecessor killed inside its transaction (a crash, kill -9) left it open, and
    read_committed readers of the topic would wait behind it (on noida-db for ever). The sink's
    own producers initialise again at their first commit. Up to FENCE_CONCURRENCY ids at once.

    Raises:
        SinkError: the broker did not answer within `deadline_seconds` (the first id that failed).
    """
    if not transactional_ids:
        return
    workers = min(FENCE_CONCURRENCY, len(transactional_ids))
    with ThreadPoolExecutor(workers, thread_name_prefix="ipcount-fence") as pool:
        # Raises the first failure in the order of the ids (the pool waits for the others).
        list(
            pool.map(
                lambda tid: _fence(producer_conf, tid, transaction_timeout_ms, deadline_seconds),
                transactional_ids,
            )
        )
    for tid in transactional_ids:
        # One line per id, in this form: chaos finds the counting query's id in the job's log.
        logger.info("transactional.id %s initialised: no transaction of a predecessor is open", tid)


def _fence(
    producer_conf: dict[str, str], tid: str, transaction_timeout_ms: int, deadline_seconds: float
) -> None:
    conf = {
        **producer_conf,
        "transactional.id": tid,
        "transaction.timeout.ms": str(transaction_timeout_ms),
        "enable.idempotence": "true",
    }
    producer = Producer(with_client_logging(conf, "ipcount.txn.librdkafka"))
    try:
        # A new producer that finds no broker connection up yet asks for its producer id again
        # only 500 ms later (librdkafka's idempotence timer): a metadata request first makes one
        # ready. Without it, 7 in 8 starts' fencing of six ids took 0.52 s instead of 0.04 s.
        producer.list_topics(timeout=deadline_seconds)
        producer.init_transactions(deadline_seconds)
    except KafkaException as exc:
        raise SinkError(
            f"could not initialise transactional.id {tid!r} to end what a predecessor left "
            f"open: {describe_kafka_error(exc)}"
        ) from exc
