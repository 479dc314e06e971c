"""What ChaosRunner gives the fault mixins it is made of (BrokerFaults, ClusterFaults): the run's
world, options, random source and report, and the runner's waiting, job starts and events."""

from __future__ import annotations

import random
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from ipcount.chaos.plan import ChaosOptions, ChaosReport
from ipcount.local_pipeline.children import JobProcess

if TYPE_CHECKING:
    from ipcount.chaos.env import ChaosEnv

__all__ = ["RunnerParts"]


class RunnerParts:
    """The attributes and methods ChaosRunner provides, declared for its mixins."""

    env: ChaosEnv
    options: ChaosOptions
    rng: random.Random
    report: ChaosReport
    faults_pending: bool

    if TYPE_CHECKING:

        @property
        def checkpoint(self) -> Path: ...
        def _tick(self) -> None: ...
        def _ready(self, job: JobProcess, next_event: str | None) -> JobProcess: ...
        def _ready_then_wait(self, job: JobProcess, kind: str, seconds: float) -> JobProcess: ...
        def _start_job(self, next_event: str | None) -> JobProcess: ...
        def _unplanned_exit(self, job: JobProcess, next_event: str | None) -> JobProcess: ...

        # ChaosRunner._event(kind, batch, outcome, injected=, signal=, recovery_s=, ...)
        _event: Callable[..., None]
