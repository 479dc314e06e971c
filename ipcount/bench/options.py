"""The pipeline benchmarks' sizes and option checks, light enough to import when the command line
is built (bench process side)."""

from __future__ import annotations

import argparse
from collections.abc import Callable

from ipcount.errors import ConfigError

__all__ = [
    "SUSTAINED_BATCH_RECORDS",
    "SUSTAINED_RECORDS",
    "Say",
    "THROUGHPUT_RECORDS",
    "sustained_overrides",
    "validate",
]

# How a benchmark reports: one line at a time, to the caller (`ipcount bench` prints them).
Say = Callable[[str], None]

THROUGHPUT_RECORDS = 1_000_000
# `ipcount bench sustained`: enough records for several data batches after the first, each of at
# most SUSTAINED_BATCH_RECORDS (the job's own default reads a whole backlog in one batch).
SUSTAINED_RECORDS = 5_000_000
SUSTAINED_BATCH_RECORDS = 500_000


def validate(args: argparse.Namespace) -> None:
    """Check the options a benchmark has; an omitted --records takes its subcommand's default.

    Raises:
        ConfigError: naming the option that is out of range.
    """
    if hasattr(args, "records") and args.records is None:
        args.records = getattr(args, "records_default", THROUGHPUT_RECORDS)
    for name in ("records", "partitions", "ips", "timeout"):
        value = getattr(args, name, 1)
        if value <= 0:
            raise ConfigError(f"--{name} must be positive, got {value}")
    if getattr(args, "event_rate", 1) <= 0:
        raise ConfigError(f"--event-rate must be positive, got {args.event_rate}")
    if getattr(args, "start", None):
        from loadgen.generator import parse_start

        parse_start(args.start)  # a bad --start fails here, before any broker starts


def sustained_overrides(args: argparse.Namespace) -> list[str]:
    """`sustained` caps a batch at SUSTAINED_BATCH_RECORDS, unless a --set caps it already."""
    if not getattr(args, "sustained", False) or any(
        o.partition("=")[0].strip() == "job.max_offsets_per_trigger" for o in args.overrides or []
    ):
        return []
    return [f"job.max_offsets_per_trigger={SUSTAINED_BATCH_RECORDS}"]
