"""The run mode `ipcount run` hands to the job: its flags checked once, where they are given."""

from __future__ import annotations

import pytest

from ipcount.config import RunMode
from ipcount.errors import ConfigError


def test_close_all_windows_needs_a_bounded_run() -> None:
    with pytest.raises(ConfigError, match="--close-all-windows needs --available-now"):
        RunMode(close_all_windows=True)
    assert RunMode(available_now=True, close_all_windows=True).close_all_windows


def test_a_restart_is_no_longer_a_new_query() -> None:
    mode = RunMode(available_now=True, close_all_windows=True, new_query=True)
    assert mode.restarted() == RunMode(available_now=True, close_all_windows=True)
