"""The `loadgen` command line: `loadgen serve` (website writing access records) and `loadgen synth`
(synthetic records straight to Kafka). Settings load like `ipcount`'s (--config, --set, env).
"""

from __future__ import annotations

import argparse
import signal
import sys
import threading
from collections.abc import Sequence
from typing import Any

from ipcount import logsetup
from ipcount.cli import add_settings_options
from ipcount.config import MAX_RECORD_BYTES, Settings, load_settings
from ipcount.errors import ConfigError, IpcountError
from loadgen.extras import require
from loadgen.generator import SynthSpec, parse_start

__all__ = ["main", "build_parser"]


def build_parser() -> argparse.ArgumentParser:
    """The `loadgen` argument parser."""
    parser = argparse.ArgumentParser(
        prog="loadgen",
        description="Generate nginx access records into the ipcount source topic.",
    )
    add_settings_options(parser)
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")

    p = sub.add_parser(
        "serve",
        help="run the demo website; each answered request becomes one access record",
        description="A small shop website. Every answered request (except /_stats and /metrics) "
        "is written as an nginx combined-format record to topics.source; the client IP is the "
        "first X-Forwarded-For hop when valid, else the peer address. Stop with Ctrl-C/SIGTERM.",
    )
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1)")
    p.add_argument("--port", type=int, default=8080, help="TCP port (default 8080; 0 picks one)")
    p.add_argument("--ledger", metavar="FILE", help="write the ground-truth ledger here")
    p.add_argument(
        "--ledger-interval", type=float, default=5.0, metavar="S",
        help="seconds between ledger writes (default 5; also written at shutdown)",
    )  # fmt: skip
    p.set_defaults(func=_run_serve)

    s = sub.add_parser(
        "synth",
        help="emit synthetic access records straight to Kafka",
        description="Synthetic records at --rate per second (for --duration seconds) or a fixed "
        "--count as fast as possible, with a skewed IP pool, jitter, late and malformed records.",
    )
    s.add_argument(
        "--count", type=int, help="number of records (as fast as possible without --rate)"
    )
    s.add_argument("--rate", type=float, help="records per second (paced)")
    s.add_argument("--duration", type=float, help="seconds to run at --rate")
    s.add_argument(
        "--ips", type=int, default=1000, help="size of the client IP pool (default 1000)"
    )
    s.add_argument(
        "--skew", type=float, default=1.1, help="Zipf exponent s (0 = uniform; default 1.1)"
    )
    s.add_argument(
        "--ipv6-share",
        type=float,
        default=0.1,
        help="share of records from IPv6 clients (default 0.1)",
    )
    s.add_argument(
        "--jitter-seconds", type=float, default=2.0,
        help="out-of-order jitter, below job.watermark_delay_seconds (default 2)",
    )  # fmt: skip
    s.add_argument(
        "--late-fraction", type=float, default=0.0,
        help="share of records sent late: an hour behind the watermark, or see "
        "--late-behind-seconds (default 0)",
    )  # fmt: skip
    s.add_argument(
        "--late-behind-seconds", type=float, metavar="S",
        help="late records are 1 to S seconds behind the event clock, as a shipper's retries are "
        "(those inside job.watermark_delay_seconds count as on time); default: an hour back",
    )  # fmt: skip
    s.add_argument(
        "--malformed-fraction", type=float, default=0.0,
        help="share of malformed records: unparseable, bad IP/timestamp, non-UTF-8, oversized",
    )  # fmt: skip
    s.add_argument("--start", help="first event time: ISO 8601 or epoch ms (default: now)")
    s.add_argument(
        "--event-rate", type=float,
        help="records per event-time second (default: wall clock with --rate, 20000 with --count)",
    )  # fmt: skip
    s.add_argument("--seed", type=int, help="random seed (same seed and options: same records)")
    s.add_argument(
        "--oversized-bytes", type=int, default=MAX_RECORD_BYTES,
        help="the oversized malformed records are longer than this, cut before their end "
        f"(default {MAX_RECORD_BYTES}: nginx's header buffer)",
    )  # fmt: skip
    s.add_argument("--ledger", metavar="FILE", help="write the ground-truth ledger here")
    s.add_argument("--batch-size", type=int, default=10_000, help=argparse.SUPPRESS)
    s.set_defaults(func=_run_synth)
    return parser


def _run_serve(args: argparse.Namespace, settings: Settings) -> int:
    require("loadgen serve", "loadgen", "aiohttp")
    from loadgen.service import serve

    if not 0 <= args.port < 65536:
        raise ConfigError(f"--port must be 0-65535, got {args.port}")
    if args.ledger_interval <= 0:
        raise ConfigError("--ledger-interval must be positive")

    def ready(url: str) -> None:
        print(f"loadgen serve: listening on {url} -> topic {settings.topics.source}", flush=True)

    try:
        result = serve(
            settings, host=args.host, port=args.port, ledger_path=args.ledger,
            save_interval=args.ledger_interval, on_ready=ready,
        )  # fmt: skip
    except OSError as exc:
        raise ConfigError(
            f"cannot listen on {args.host}:{args.port}: {exc.strerror or exc}"
        ) from exc
    print(result.summary(), flush=True)
    return 0 if result.ok else 1


def _run_synth(args: argparse.Namespace, settings: Settings) -> int:
    from loadgen.synth import SynthOptions, run_synth

    spec = SynthSpec(
        ips=args.ips,
        skew=args.skew,
        ipv6_share=args.ipv6_share,
        jitter_seconds=args.jitter_seconds,
        late_fraction=args.late_fraction,
        late_behind_seconds=args.late_behind_seconds,
        malformed_fraction=args.malformed_fraction,
        event_rate=args.event_rate,
        seed=args.seed,
        window_ms=int(settings.job.window_seconds * 1000),
        watermark_delay_seconds=settings.job.watermark_delay_seconds,
        late_corrections=settings.job.late_corrections,
        max_record_bytes=args.oversized_bytes,
    )
    spec.validate()
    if args.batch_size < 1:
        raise ConfigError("--batch-size must be at least 1")
    stop = threading.Event()

    def on_signal(signum: int, frame: Any) -> None:
        # First signal: stop, flush and write the ledger; a second one gives up at once.
        if stop.is_set():
            raise KeyboardInterrupt
        stop.set()

    previous = {sig: signal.signal(sig, on_signal) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        options = SynthOptions(
            count=args.count, rate=args.rate, duration=args.duration,
            start_ms=parse_start(args.start) if args.start else None,
            ledger_path=args.ledger, batch_size=args.batch_size,
        )  # fmt: skip
        result = run_synth(settings, spec, options, stop)
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    print(result.summary(), flush=True)
    if result.errors or result.unreported:
        return 1
    if result.interrupted and result.target is not None:
        return 130
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """Run the CLI; returns the exit status (errors print one line, no stack trace)."""
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        logsetup.configure(args.log_level, args.log_format)
    except ValueError as exc:  # a bad IPCOUNT_LOG_FORMAT / IPCOUNT_LOG_LEVEL
        print(f"loadgen: error: {exc}", file=sys.stderr)
        return 2
    func: Any = getattr(args, "func", None)
    if func is None:
        parser.print_help()
        return 2
    try:
        settings = load_settings(args.config, overrides=args.overrides)
        return int(func(args, settings) or 0)
    except IpcountError as exc:
        print(f"loadgen {args.command}: error: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print(f"loadgen {args.command}: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
