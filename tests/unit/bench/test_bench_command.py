"""`ipcount bench`: one entry point, a subcommand per benchmark, each with the options it had
under `loadgen bench` and `python -m loadgen.bench.source|sink`."""

from __future__ import annotations

import subprocess
import sys

import pytest

from ipcount.cli import build_parser


# fmt: off
@pytest.mark.parametrize(
    "argv",
    [
        ["throughput", "--records", "7000", "--partitions", "2", "--ips", "9", "--skew", "0",
         "--event-rate", "100", "--start", "2026-01-01T00:00:00Z", "--seed", "3",
         "--bootstrap", "h:1", "--spark-conf", "a=b", "--no-event-log", "--timeout", "9",
         "--keep", "-v"],
        ["sustained", "--records", "7000", "--partitions", "2", "-v", "--no-event-log"],
        ["latency", "--rates", "1000,2000", "--duration", "30", "--warmup", "5",
         "--partitions", "2", "--ips", "9", "--bootstrap", "h:1", "--spark-conf", "a=b", "--keep"],
        ["scaling", "--cells", "baseline", "--list-cells", "--variant", "v:ips=5", "--repeat",
         "2", "--records", "7000", "--no-event-log", "--timeout", "9", "--keep"],
        ["source", "--records", "5000", "--partitions", "2", "--bootstrap", "h:1",
         "--master", "local[1]", "--max-offsets-per-trigger", "900", "--spark-runs", "1"],
        ["sink", "--sizes", "10,20", "--bootstrap", "h:1", "--partitions", "2", "--history",
         "0,300"],
    ],
    ids=lambda argv: argv[0],
)
# fmt: on
def test_every_benchmark_is_a_subcommand_with_its_options(argv: list[str]) -> None:
    args = build_parser().parse_args(["bench", *argv])
    assert args.command == "bench" and args.bench == argv[0] and callable(args.func)


@pytest.mark.parametrize("flag", ["--latency", "--scaling", "--sustained"])
def test_the_mode_flags_are_gone(flag: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        build_parser().parse_args(["bench", flag])
    assert "throughput" in capsys.readouterr().err  # argparse lists the subcommands


def test_ipcount_bench_help_lists_the_benchmarks() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "ipcount", "bench", "--help"],
        capture_output=True, text=True, timeout=60, check=True,
    ).stdout  # fmt: skip
    for name in ("throughput", "sustained", "latency", "scaling", "source", "sink"):
        assert name in out, out


def test_loadgen_has_no_bench_any_more() -> None:
    from loadgen.cli import build_parser as loadgen_parser

    with pytest.raises(SystemExit):
        loadgen_parser().parse_args(["bench"])


def test_a_bad_size_names_its_option() -> None:
    from ipcount.bench.options import validate
    from ipcount.errors import ConfigError

    args = build_parser().parse_args(["bench", "throughput", "--partitions", "0"])
    with pytest.raises(ConfigError, match="--partitions must be positive"):
        validate(args)


@pytest.mark.parametrize("bench", ["throughput", "sustained", "scaling", "costs"])
def test_a_bad_start_names_its_option_before_any_broker_starts(bench: str) -> None:
    from ipcount.bench.options import validate
    from ipcount.errors import ConfigError

    args = build_parser().parse_args(["bench", bench, "--start", "last tuesday"])
    with pytest.raises(ConfigError, match="--start 'last tuesday'"):
        validate(args)
