"""The sink's transactional producer calls with their Kafka errors classified (driver): retriable
ones retried until a deadline, those needing an abort aborted, fenced and fatal ones final."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any, NoReturn, TypeVar

from confluent_kafka import KafkaError, KafkaException, Message, Producer

from ipcount.errors import FatalKafkaError, SinkError, TransactionAbortedError
from ipcount.kafka.client import describe_kafka_error, transaction_timeout_error
from ipcount.sink.producer_config import TxnConfig

__all__ = ["TxnCalls", "is_fenced", "produce"]

logger = logging.getLogger(__name__)

T = TypeVar("T")

# librdkafka reports a fenced producer as _FENCED (fatal); the broker codes behind it too.
_FENCED_CODES = {KafkaError._FENCED, KafkaError.PRODUCER_FENCED, KafkaError.INVALID_PRODUCER_EPOCH}
_BACKOFF_START, _BACKOFF_MAX = 0.1, 2.0
# Errors about one record's content (its size, its form): a retry of the batch meets the same
# record and fails the same way, so they stop the job at once with what to change.
_CONTENT_CODES = {
    KafkaError.MSG_SIZE_TOO_LARGE,
    KafkaError.RECORD_LIST_TOO_LARGE,
    KafkaError.INVALID_RECORD,
    KafkaError.INVALID_MSG_SIZE,
    KafkaError.INVALID_MSG,
    KafkaError.INVALID_TIMESTAMP,
}


class TxnCalls:
    """One transactional producer for `config.transactional_id` and whether a transaction is open;
    every transactional call goes through `_call`, which classifies its Kafka errors
    (sink.transaction.TxnSession builds the batch protocol on top)."""

    def __init__(self, config: TxnConfig) -> None:
        self.config = config
        self._producer: Producer | None = None
        self._in_transaction = False

    @property
    def started(self) -> bool:
        return self._producer is not None

    def abort_open(self, batch_id: int) -> bool:
        """Abort the open transaction, if any. Returns whether one was open."""
        if not self._in_transaction or self._producer is None:
            return False
        producer = self._producer
        self._call("abort_transaction", lambda t: producer.abort_transaction(t))
        self._in_transaction = False
        logger.warning("batch %d: open transaction aborted", batch_id)
        return True

    def _live_producer(self) -> Producer:
        """The producer of a started session.

        Raises:
            SinkError: the session was not started, or its producer was discarded.
        """
        if self._producer is None:
            raise SinkError(
                f"transactional.id {self.config.transactional_id!r} has no producer: the "
                "session was not started or its producer was discarded"
            )
        return self._producer

    def close(self) -> None:
        """Drop the producer (an open transaction is aborted by the next init with this id)."""
        self._producer = None
        self._in_transaction = False

    def _call(self, op: str, fn: Callable[[float], T], batch_id: int | None = None) -> T:
        """Run one transactional API call, classifying its Kafka errors: retriable -> retry with
        back-off until retry_deadline_seconds; txn_requires_abort -> abort, TransactionAbortedError;
        fenced/fatal -> FatalKafkaError; INVALID_TRANSACTION_TIMEOUT -> ConfigError."""
        cfg = self.config
        deadline = time.monotonic() + cfg.retry_deadline_seconds
        backoff = _BACKOFF_START
        while True:
            remaining = max(deadline - time.monotonic(), 0.1)
            try:
                return fn(remaining)
            except KafkaException as exc:
                err = exc.args[0] if exc.args else None
                if not isinstance(err, KafkaError):
                    self._discard()
                    raise FatalKafkaError(f"{op} failed unexpectedly: {exc}") from exc
                if err.code() == KafkaError.INVALID_TRANSACTION_TIMEOUT:
                    self._discard()
                    raise transaction_timeout_error(cfg.transaction_timeout_ms, None) from exc
                if err.fatal() or err.code() in _FENCED_CODES:
                    raise self._fatal(op, err) from exc
                if err.txn_requires_abort() and op != "abort_transaction":
                    self._fail_in_transaction(batch_id, op, exc)
                if err.retriable() and time.monotonic() < deadline:
                    logger.warning(
                        "%s: retriable Kafka error, retrying in %.1fs: %s",
                        op,
                        backoff,
                        describe_kafka_error(err),
                    )
                    time.sleep(backoff)
                    backoff = min(backoff * 2, _BACKOFF_MAX)
                    continue
                if self._in_transaction:
                    self._fail_in_transaction(batch_id, op, exc)
                self._discard()
                why = (
                    "kept failing past sink.retry_deadline_seconds" if err.retriable() else "failed"
                )
                raise SinkError(f"{op} {why} ({cfg.retry_deadline_seconds:g}s)", err) from exc

    def _fatal(self, op: str, err: KafkaError) -> FatalKafkaError:
        """Drop the producer and build the error for a fenced or fatally failed producer."""
        self._discard()
        cfg = self.config
        if err.code() in _FENCED_CODES:
            return FatalKafkaError(
                f"{op}: this writer was fenced: another producer started with the same "
                f"transactional.id {cfg.transactional_id!r} (query {cfg.query_id}). Two jobs are "
                "using the same checkpoint; this one stops, the newer one continues",
                err,
            )
        return FatalKafkaError(
            f"{op}: fatal Kafka error for transactional.id {cfg.transactional_id!r}; the producer "
            "cannot continue: restart the job",
            err,
        )

    def _fail_in_transaction(self, batch_id: int | None, op: str, exc: KafkaException) -> NoReturn:
        """Abort the open transaction and raise TransactionAbortedError (or FatalKafkaError)."""
        err = exc.args[0] if exc.args else exc
        if isinstance(err, KafkaError) and (err.fatal() or err.code() in _FENCED_CODES):
            raise self._fatal(f"{op} for batch {batch_id}", err) from exc
        self._in_transaction = False
        producer = self._live_producer()
        self._call("abort_transaction", lambda t: producer.abort_transaction(t))
        if isinstance(err, KafkaError) and err.code() in _CONTENT_CODES:
            raise FatalKafkaError(
                f"{op} for batch {batch_id}: Kafka refused a record of topic "
                f"{self.config.topic!r} for its content; its transaction was aborted, and every "
                "retry would meet the same record, so the job stops. Make the largest record "
                "fit: raise the topic's max.message.bytes or kafka.producer.message.max.bytes, "
                "or lower job.dead_letter_max_bytes",
                err,
            ) from exc
        raise TransactionAbortedError(
            f"{op} for batch {batch_id} failed; its transaction was aborted, nothing of it is "
            "visible to read_committed readers, and the batch can be retried",
            err,
        ) from exc

    def _abort_quietly(self, batch_id: int) -> None:
        try:
            self.abort_open(batch_id)
        except Exception:  # the original error matters more; the next init aborts it anyway
            logger.exception("batch %d: abort after a failure failed too", batch_id)
            self._discard()

    def _discard(self) -> None:
        """Drop a producer that cannot be reused (fatal, fenced, or failed past the deadline)."""
        self._producer = None
        self._in_transaction = False


def is_fenced(exc: FatalKafkaError) -> bool:
    err = exc.kafka_error
    return isinstance(err, KafkaError) and err.code() in _FENCED_CODES


def produce(
    producer: Producer,
    topic: str,
    value: bytes | None,
    key: bytes | None,
    headers: list[tuple[str, bytes]] | None = None,
    on_delivery: Callable[[KafkaError | None, Message], None] | None = None,
) -> None:
    """Produce one record, waiting for room in the producer's local queue when it is full."""
    extra: dict[str, Any] = {}
    if headers:
        extra["headers"] = headers
    if on_delivery is not None:
        extra["on_delivery"] = on_delivery
    while True:
        try:
            producer.produce(topic, value, key, **extra)
            return
        except BufferError:
            # The local queue is full: let librdkafka send, then try again.
            producer.poll(0.05)
