"""The Python workers `ipcount run` starts ahead of the first micro-batch (job.warmup) start for
real on a fresh machine: the warm-up's read tasks succeed, one per core."""

from __future__ import annotations

import logging
from typing import Any

import pytest


def test_the_warm_up_runs_one_read_task_per_core_and_succeeds(
    spark: Any, caplog: pytest.LogCaptureFixture
) -> None:
    from ipcount.job.warmup import warm_python_workers

    caplog.set_level(logging.DEBUG, logger="ipcount.job.warmup")
    thread = warm_python_workers(spark)
    thread.join(180)
    assert not thread.is_alive(), "the warm-up job did not finish in 180 s"
    # A failure only costs the time it would have saved, so the job logs it and goes on; here
    # it must not happen (it once wrote a debugging file under a directory only one machine had).
    failures = [r.getMessage() for r in caplog.records if "failed" in r.getMessage()]
    assert failures == []
