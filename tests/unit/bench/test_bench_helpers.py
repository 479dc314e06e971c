"""The bench's small helpers, without a broker: the latency percentiles, --scaling variants and
the pre-load plan."""

from __future__ import annotations

from pathlib import Path

import pytest

from ipcount.bench.commit_watch import percentile
from ipcount.bench.scaling import parse_variant


def test_latency_percentiles_are_nearest_rank() -> None:
    assert percentile([3.0, 1.0, 2.0, 4.0], 50) == 2.0
    assert percentile([3.0, 1.0, 2.0, 4.0], 99) == 4.0


def test_a_scaling_variant_names_its_partitions_ips_settings_and_env() -> None:
    cell = parse_variant("ab:partitions=6,ips=10,spark.shuffle_partitions=2,env.PYTHONPATH=/x")
    assert (cell.name, cell.partitions, cell.ips) == ("ab", 6, 10)
    assert cell.settings == ("spark.shuffle_partitions=2",)
    assert cell.env == (("PYTHONPATH", "/x"),)


@pytest.mark.parametrize("bench", ["throughput", "sustained", "scaling", "costs"])
def test_every_pre_loading_benchmark_loads_the_source_its_options_describe(
    bench: str, tmp_path: Path
) -> None:
    # `ipcount bench BENCH --start ... --partitions ...`: the source it pre-loads has that shape
    # and its event time starts at --start (it plans the load; no broker is needed to plan).
    from ipcount.bench.measure import plan_preload
    from ipcount.bench.workspace import BenchEnv
    from ipcount.cli import build_parser

    args = build_parser().parse_args(
        ["bench", bench, "--start", "2026-11-22T10:00:00Z", "--partitions", "4", "--ips", "77",
         "--skew", "1.3", "--event-rate", "500", "--seed", "9"]
    )  # fmt: skip
    env = BenchEnv("127.0.0.1:1", tmp_path, None, [])
    plan = plan_preload(env, bench, args)
    assert plan.start_ms == 1_795_341_600_000
    assert plan.settings.topics.source_partitions == 4
    assert plan.settings.topics.source in env.topics
    spec = plan.spec
    assert (spec.ips, spec.skew, spec.event_rate, spec.seed) == (77, 1.3, 500.0, 9)
    assert "topics.source_partitions=4" in plan.overrides


def test_a_scaling_cell_loads_its_own_shape(tmp_path: Path) -> None:
    from ipcount.bench.measure import plan_preload
    from ipcount.bench.workspace import DEFAULT_START_MS, BenchEnv
    from ipcount.cli import build_parser

    args = build_parser().parse_args(["bench", "scaling"])
    env = BenchEnv("127.0.0.1:1", tmp_path, None, [])
    plan = plan_preload(env, "cell", args, partitions=6, ips=10, skew=0.0)
    assert plan.start_ms == DEFAULT_START_MS
    assert plan.settings.topics.source_partitions == 6
    assert (plan.spec.ips, plan.spec.skew) == (10, 0.0)
