"""The noida-db workarounds switch on for noida-db only: detection against the real broker."""

from __future__ import annotations

import os

import pytest

from ipcount.kafka.quirks import NOIDA_DB, NONE, broker_quirks


def test_quirks_are_detected_for_the_broker_kind(bootstrap: str, broker_kind: str) -> None:
    if os.environ.get("IPCOUNT_TEST_BOOTSTRAP"):
        pytest.skip("external broker: its kind is not known to the tests")
    found = broker_quirks({"bootstrap.servers": bootstrap})
    assert found == (NOIDA_DB if broker_kind == "noida-db" else NONE)
    # Said outright, no broker is asked.
    assert broker_quirks({"bootstrap.servers": "nowhere:1"}, "none") == NONE
