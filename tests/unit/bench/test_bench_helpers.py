"""The bench's small helpers, without a broker: the latency percentiles and --scaling variants."""

from __future__ import annotations

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
