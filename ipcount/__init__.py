"""ipcount: exactly-once per-IP request counts in 5-second event-time windows, Kafka to Kafka on
Spark."""

__all__ = ["__version__"]

__version__ = "0.1.0"
