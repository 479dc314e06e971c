"""The `ipcount` command line: loads settings once, then runs one ipcount.commands subcommand."""

from __future__ import annotations

import argparse
import importlib
import logging
import pkgutil
import sys
from collections.abc import Sequence

import ipcount.commands
from ipcount import __version__, logsetup
from ipcount.config import load_settings
from ipcount.errors import IpcountError

__all__ = ["main", "build_parser", "add_settings_options"]

logger = logging.getLogger(__name__)


def add_settings_options(parser: argparse.ArgumentParser) -> None:
    """The options every ipcount/loadgen command line shares: --config, --set, --log-level,
    --log-format."""
    parser.add_argument(
        "-c",
        "--config",
        help="settings file (default: env IPCOUNT_CONFIG, else ./conf/ipcount.toml, "
        "else built-in defaults)",
    )
    parser.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="SECTION.KEY=VALUE",
        help="override one setting, e.g. --set job.window_seconds=10 "
        "--set kafka.client.security.protocol=SASL_SSL (repeatable)",
    )
    parser.add_argument("--log-level", default=None, help="DEBUG, INFO (default), WARNING, ERROR")
    parser.add_argument(
        "--log-format",
        choices=logsetup.FORMATS,
        default=None,
        help="text (default; env IPCOUNT_LOG_FORMAT) or json: one JSON object per line, the "
        "per-batch progress figures as fields",
    )


def build_parser() -> argparse.ArgumentParser:
    """The argument parser with every command module's subcommand registered."""
    parser = argparse.ArgumentParser(
        prog="ipcount",
        description="Exactly-once per-IP request counts in event-time windows, "
        "Kafka to Kafka on Spark.",
    )
    parser.add_argument("--version", action="version", version=f"ipcount {__version__}")
    add_settings_options(parser)
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    modules = {
        info.name: importlib.import_module(f"ipcount.commands.{info.name}")
        for info in pkgutil.iter_modules(ipcount.commands.__path__)
        if not info.name.startswith("_")
    }
    # The benchmarks are a package of their own, above the commands (they run the whole pipeline).
    modules["bench"] = importlib.import_module("ipcount.bench.subcommands")
    order = ipcount.commands.HELP_ORDER
    for name in sorted(modules, key=lambda n: order.index(n) if n in order else len(order)):
        modules[name].register(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the CLI; returns the process exit status (errors print one line, no stack trace)."""
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        logsetup.configure(args.log_level, args.log_format)
    except ValueError as exc:  # a bad IPCOUNT_LOG_FORMAT / IPCOUNT_LOG_LEVEL
        print(f"ipcount: error: {exc}", file=sys.stderr)
        return 2
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    try:
        settings = load_settings(args.config, overrides=args.overrides)
        return int(args.func(args, settings) or 0)
    except IpcountError as exc:
        print(f"ipcount {args.command}: error: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print(f"ipcount {args.command}: interrupted", file=sys.stderr)
        return 130
