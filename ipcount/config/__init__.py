"""Typed, validated settings: conf/ipcount.toml, then IPCOUNT_* env overrides, then CLI --set
overrides. The section classes live in `ipcount.config.settings`; the rest of ipcount needs only
what is named here."""

from ipcount.config.load import default_config_path, load_settings
from ipcount.config.settings import Settings, redact

__all__ = ["Settings", "default_config_path", "load_settings", "redact"]
