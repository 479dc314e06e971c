"""Fixtures of the sink's integration tests."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from ipcount.config import Settings
from ipcount.kafka.topics import ensure_topics


@pytest.fixture
def sink_settings(make_settings: Callable[..., Settings]) -> Settings:
    """Settings of this test's own topics, created on the test broker."""
    settings = make_settings()
    ensure_topics(settings)
    return settings
