"""The ipcount exception hierarchy; every error an operator can act on derives from IpcountError."""

from __future__ import annotations

from typing import Any

__all__ = [
    "IpcountError",
    "ConfigError",
    "SchemaError",
    "DecodeError",
    "SourceError",
    "DataLossError",
    "SinkError",
    "TransactionAbortedError",
    "FatalKafkaError",
    "BrokerError",
    "SinkHistoryError",
]


class IpcountError(Exception):
    """Base of every ipcount error; the CLI prints its message without a stack trace."""


class ConfigError(IpcountError):
    """A setting is missing, unknown or invalid: fix the named setting in the config, env or CLI."""


class SchemaError(IpcountError):
    """A record does not match the Avro schema it is written or read with."""


class DecodeError(IpcountError):
    """A record could not be decoded (wrong wire format, schema fingerprint, corrupt bytes)."""


class SourceError(IpcountError):
    """The Kafka source cannot continue (missing topic, lost offsets with failOnDataLoss=true)."""


class DataLossError(SourceError):
    """Records of the source were deleted (retention, a re-created topic) before the job read
    them, with failOnDataLoss=true (job.fail_on_data_loss): no restart can bring them back. Set
    job.fail_on_data_loss = false to skip exactly the lost offsets and go on."""


class BrokerError(IpcountError):
    """The Kafka broker is unreachable, or the local development broker failed to start or stop."""


class SinkError(IpcountError):
    """The transactional sink cannot write a batch."""

    def __init__(self, message: str, kafka_error: Any = None) -> None:
        super().__init__(message)
        self.kafka_error = kafka_error

    def __str__(self) -> str:
        base = super().__str__()
        err = self.kafka_error
        if err is None:
            return base
        try:
            detail = f"{err.name()} (code {err.code()}): {err.str()}"
        except AttributeError:
            detail = str(err)
        return f"{base} [{type(self).__name__}: {detail}]"


class TransactionAbortedError(SinkError):
    """The batch's transaction was aborted; Spark retries the batch."""


class FatalKafkaError(SinkError):
    """The producer cannot go on (fenced by a newer instance, or a fatal error): restart the job."""


class SinkHistoryError(IpcountError):
    """Spark's checkpoint and the sink's committed history disagree (a deleted or restored
    checkpoint, a second query on the same sink, a commit the broker lost): the job stops rather
    than count anything twice or skip it. The message names both sides and how to recover."""
