"""Secrets out of repr and logs: librdkafka-style settings with their secret values masked."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

__all__ = ["redact"]

# Keys whose values never appear in repr or logs.
_SECRET_MARKERS = (
    "password",
    "secret",
    "user.info",
    "token",
    "key.pem",
    "credentials",
    # sasl.oauthbearer.config carries client secrets as "key=value" pairs.
    "oauthbearer.config",
)


def redact(conf: Mapping[str, Any]) -> dict[str, Any]:
    """Return a copy of a librdkafka-style dict with secret values replaced by '***'."""
    return {
        k: ("***" if any(m in k.lower() for m in _SECRET_MARKERS) else v) for k, v in conf.items()
    }
