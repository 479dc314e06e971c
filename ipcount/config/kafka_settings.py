"""The `[kafka]` section: where Kafka is, and the librdkafka settings of every client ipcount
opens, by role (`kafka.client`, `kafka.consumer`, `kafka.producer`, `kafka.admin`)."""

from __future__ import annotations

from dataclasses import dataclass, field

from ipcount.config.redaction import redact

__all__ = ["CLIENT_DEFAULTS", "KafkaSettings"]

# ipcount's defaults under every client's kafka.* settings (each can be overridden there).
# reconnect.backoff.ms: librdkafka (2.x) drops its bootstrap connection once the first metadata
# names the brokers, and a new client's first request then waits out a cluster-connection
# suppression of half this backoff: ~50 ms with librdkafka's 100, ~5 ms with 10. The sink opens
# clients per task and batch (a task's producer and its progress reads: 66 -> 13-28 ms a read of
# the progress topic); the backoff still doubles up to reconnect.backoff.max.ms while a broker is
# down.
CLIENT_DEFAULTS = {"reconnect.backoff.ms": "10"}


@dataclass(frozen=True)
class KafkaSettings:
    """Where Kafka is and how every client talks to it (`kafka.*` passthrough tables)."""

    bootstrap_servers: str = "127.0.0.1:9092"
    # librdkafka settings for every client (SASL/TLS go here), then per role.
    client: dict[str, str] = field(default_factory=dict)
    consumer: dict[str, str] = field(default_factory=dict)
    producer: dict[str, str] = field(default_factory=dict)
    admin: dict[str, str] = field(default_factory=dict)
    # How long a CLI waits for the broker to answer before giving up.
    connect_timeout_seconds: float = 10.0
    # Workarounds for the embedded noida-db broker: "auto" (ask the broker), "noida-db", "none".
    broker_quirks: str = "auto"

    def common(self) -> dict[str, str]:
        """The settings of every client: ipcount's CLIENT_DEFAULTS, then kafka.client's."""
        return {**CLIENT_DEFAULTS, **self.client}

    def to_librdkafka(self, role: str = "client") -> dict[str, str]:
        """The dotted-key dict for one client role: consumer, producer, admin or client."""
        conf: dict[str, str] = {"bootstrap.servers": self.bootstrap_servers}
        conf.update(self.common())
        if role in ("consumer", "producer", "admin"):
            conf.update(getattr(self, role))
        elif role != "client":
            raise ValueError(f"unknown Kafka client role {role!r}")
        return conf

    def __repr__(self) -> str:
        return (
            f"KafkaSettings(bootstrap_servers={self.bootstrap_servers!r}, "
            f"client={redact(self.client)!r}, consumer={redact(self.consumer)!r}, "
            f"producer={redact(self.producer)!r}, admin={redact(self.admin)!r})"
        )
