"""The Python workers' garbage-collector handling: pause and restore, freeze once per process."""

from __future__ import annotations

import gc
import subprocess
import sys

import pytest

from ipcount.worker_gc import gc_paused


@pytest.mark.parametrize("enabled", [True, False])
def test_gc_paused_restores_the_previous_state(enabled: bool) -> None:
    was = gc.isenabled()
    try:
        (gc.enable if enabled else gc.disable)()
        with gc_paused():
            assert not gc.isenabled()
        assert gc.isenabled() is enabled
        with pytest.raises(RuntimeError), gc_paused():
            raise RuntimeError("boom")
        assert gc.isenabled() is enabled
    finally:
        (gc.enable if was else gc.disable)()


def test_freeze_long_lived_runs_once_per_process() -> None:
    # In a child process: freezing is process-wide and must not leak into the test session.
    code = (
        "import gc\n"
        "from ipcount.worker_gc import freeze_long_lived\n"
        "assert gc.get_freeze_count() == 0\n"
        "freeze_long_lived()\n"
        "first = gc.get_freeze_count()\n"
        "assert first > 0\n"
        "later = [object() for _ in range(10)], [[] for _ in range(1000)]\n"
        "freeze_long_lived()\n"
        "assert gc.get_freeze_count() == first, 'froze again'\n"
        "assert gc.collect() == 0\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
