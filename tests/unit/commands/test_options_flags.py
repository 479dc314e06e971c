"""`ipcount chaos` and `ipcount soak`: each flag sets one field of the run's options, and a flag
left out keeps that field's default (the options dataclass holds every default once)."""

from __future__ import annotations

from pathlib import Path

from ipcount.chaos.plan import ChaosOptions
from ipcount.cli import build_parser
from ipcount.commands import options_from
from ipcount.soak.runner import SoakOptions


def test_soak_flags_set_their_fields(tmp_path: Path) -> None:
    args = build_parser().parse_args(
        ["soak", "--duration", "30", "--rate", "50", "--restart-every", "0"]
        + ["--report-every", "10", "--ips", "7", "--seed", "5", "--trigger-interval", "2.5"]
        + ["--work-dir", str(tmp_path), "--use-configured-broker"]
    )
    assert options_from(args, SoakOptions) == SoakOptions(
        work_dir=tmp_path,
        duration_seconds=30.0,
        rate=50.0,
        restart_every_seconds=0.0,
        report_every_seconds=10.0,
        ips=7,
        seed=5,
        use_configured_broker=True,
        trigger_interval_seconds=2.5,
    )


def test_soak_and_chaos_without_flags_run_with_their_options_defaults() -> None:
    soak = build_parser().parse_args(["soak"])
    assert options_from(soak, SoakOptions, sets=("job.window_seconds=10",)) == SoakOptions(
        sets=("job.window_seconds=10",)
    )
    chaos = build_parser().parse_args(["chaos"])
    assert options_from(chaos, ChaosOptions) == ChaosOptions(work_dir=Path(".ipcount/chaos"))


def test_chaos_flags_set_their_fields(tmp_path: Path) -> None:
    args = build_parser().parse_args(
        ["chaos", "--records", "500", "--kills", "4", "--broker-hang", "3.5", "--seed", "9"]
        + ["--work-dir", str(tmp_path), "--start-timeout", "90"]
    )
    assert options_from(args, ChaosOptions) == ChaosOptions(
        work_dir=tmp_path,
        records=500,
        kills=4,
        broker_hang_seconds=3.5,
        seed=9,
        start_timeout_seconds=90.0,
    )
