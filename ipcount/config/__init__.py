"""Typed, validated settings: conf/ipcount.toml, then IPCOUNT_* env overrides, then CLI --set
overrides. `Settings` and `load_settings` are what the rest of ipcount uses."""

from ipcount.config.load import ENV_PREFIX, default_config_path, load_settings
from ipcount.config.settings import (
    BrokerSettings,
    JobSettings,
    KafkaSettings,
    Settings,
    SinkSettings,
    SparkSettings,
    TopicSettings,
    redact,
)

__all__ = [
    "KafkaSettings",
    "TopicSettings",
    "JobSettings",
    "SinkSettings",
    "BrokerSettings",
    "SparkSettings",
    "Settings",
    "ENV_PREFIX",
    "default_config_path",
    "load_settings",
    "redact",
]
