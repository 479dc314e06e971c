"""`ipcount run`: the streaming job (also the spark-submit entry point via ipcount/__main__.py)."""

from __future__ import annotations

import argparse

from ipcount.commands import SubParsers
from ipcount.config import RunMode, Settings
from ipcount.errors import ConfigError

__all__ = ["register"]


def register(sub: SubParsers) -> None:
    p = sub.add_parser(
        "run",
        help="run the IP-count streaming job",
        description="Run the Spark job: source topic -> 5 s event-time windows per IP -> "
        "transactional Avro sink. Stops cleanly on SIGTERM/Ctrl-C; "
        "a restart resumes from the checkpoint.",
    )
    p.add_argument(
        "--available-now",
        action="store_true",
        help="process everything in the source now, emit every window, then stop",
    )
    p.add_argument(
        "--close-all-windows",
        action="store_true",
        help="with --available-now: the input is finished, so emit every window, also those whose "
        "end the data has not passed yet. Records that arrive later for those windows are late "
        "(counted as late corrections). Without it a bounded run emits only the windows its data "
        "closed and the next run continues where the data left event time: periodic runs lose "
        "nothing",
    )
    p.add_argument(
        "--new-query",
        action="store_true",
        help="this checkpoint is new but the sink already holds another query's output from the "
        "same source (a deleted or replaced checkpoint): start where that output ends instead "
        "of refusing. Windows still open in the old query when it stopped then get only their "
        "later records",
    )
    p.add_argument("--timeout", type=float, default=None, help="stop after this many seconds")
    p.add_argument(
        "--metrics-port",
        type=int,
        default=None,
        metavar="PORT",
        help="serve Prometheus metrics on http://HOST:PORT/metrics and health on /healthz "
        "(HOST: metrics.host, default 127.0.0.1; default PORT: metrics.port, 0 = off)",
    )
    p.set_defaults(func=run)


def run(args: argparse.Namespace, settings: Settings) -> int:
    from ipcount.job.supervisor import run_job

    if args.metrics_port is not None and not 0 <= args.metrics_port < 65536:
        raise ConfigError(f"--metrics-port must be 0 (off) or a TCP port, got {args.metrics_port}")
    mode = RunMode(
        available_now=args.available_now,
        close_all_windows=args.close_all_windows,
        new_query=args.new_query,
    )
    return run_job(settings, mode=mode, timeout=args.timeout, metrics_port=args.metrics_port)
