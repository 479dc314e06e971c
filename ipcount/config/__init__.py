"""Typed, validated settings: conf/ipcount.toml, then IPCOUNT_* env overrides, then CLI --set
overrides. The section classes live in `ipcount.config.settings`; the rest of ipcount needs only
what is named here."""

from ipcount.config.load import default_config_path, load_settings
from ipcount.config.redaction import redact
from ipcount.config.run_mode import RunMode
from ipcount.config.settings import (
    MAX_BYTES_PER_BATCH,
    MAX_RECORD_BYTES,
    MIN_BYTES_PER_BATCH,
    MIN_TRANSACTION_TIMEOUT_MS,
    NATIVE_MODES,
    Settings,
    SinkSettings,
)

__all__ = [
    "MAX_BYTES_PER_BATCH",
    "MAX_RECORD_BYTES",
    "MIN_BYTES_PER_BATCH",
    "MIN_TRANSACTION_TIMEOUT_MS",
    "NATIVE_MODES",
    "Settings",
    "SinkSettings",
    "default_config_path",
    "load_settings",
    "redact",
    "RunMode",
]
