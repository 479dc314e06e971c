"""A soak's own figures reach the chaos environment it runs in (generator and job)."""

from __future__ import annotations

from pathlib import Path

from ipcount.config import Settings
from ipcount.soak.runner import SoakOptions, SoakRunner


def test_the_soak_s_traffic_and_job_figures_are_the_ones_the_run_uses(tmp_path: Path) -> None:
    options = SoakOptions(
        work_dir=tmp_path,
        duration_seconds=30.0,
        rate=50.0,
        ips=7,
        seed=5,
        use_configured_broker=True,
        trigger_interval_seconds=2.5,
    )
    chaos = SoakRunner(Settings(), options).env.options
    assert (chaos.records, chaos.kills, chaos.broker_restarts) == (1500, 0, 0)
    assert (chaos.work_dir, chaos.rate, chaos.ips, chaos.seed) == (tmp_path, 50.0, 7, 5)
    assert chaos.use_configured_broker
    assert chaos.trigger_interval_seconds == 2.5
