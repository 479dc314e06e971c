"""`ipcount dashboard`: a web page with the top-N IPs per window, requests per window and the
job's health, updating live."""

from __future__ import annotations

import argparse
import signal
import sys
import threading

from ipcount.commands import SubParsers, add_no_late_option
from ipcount.config import Settings
from ipcount.dashboard.scrape import MetricsPoller
from ipcount.dashboard.server import DashboardServer, LiveTop
from ipcount.observe.httpserve import http_limits

__all__ = ["register", "run"]


def register(sub: SubParsers) -> None:
    p = sub.add_parser(
        "dashboard",
        help="serve a live web page: top-N IPs per window, requests per window, job health",
        description="Serve a web page that shows, for each closed window, the top-N IPs as a bar "
        "chart (counts corrected by late records, as `ipcount top` computes them), the requests "
        "per window over time, and the job's health (source lag, watermark delay, batch time, "
        "late and malformed records) from its Prometheus endpoint when --metrics-url is given. "
        "It reads topics.sink and topics.late with read_committed in a background thread; the "
        "page polls /api/top?n=N and /api/health every second.",
    )
    p.add_argument("--port", type=int, default=8050, help="TCP port (default 8050; 0: any free)")
    p.add_argument(
        "--host",
        default="127.0.0.1",
        help="address to listen on (default 127.0.0.1; 0.0.0.0 for every interface)",
    )
    p.add_argument(
        "--allow-host",
        action="append",
        default=[],
        metavar="NAME",
        help="also answer requests whose Host header is NAME (repeatable; '*': any). Without it "
        "only localhost, loopback addresses and --host are answered (against DNS rebinding); "
        "see also http.allowed_hosts",
    )
    p.add_argument(
        "--metrics-url",
        default=None,
        metavar="URL",
        help="the job's Prometheus endpoint, e.g. http://127.0.0.1:9464/metrics",
    )
    p.add_argument(
        "--keep",
        type=int,
        default=720,
        metavar="K",
        help="windows kept in memory and shown (default 720: one hour of 5 s windows)",
    )
    add_no_late_option(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace, settings: Settings) -> int:
    if args.keep < 1:
        raise SystemExit("ipcount dashboard: error: --keep must be at least 1")
    metrics = MetricsPoller(args.metrics_url)
    live = LiveTop(settings, keep=args.keep, with_late=not args.no_late)
    allowed = [h.strip() for h in settings.http.allowed_hosts.split(",") if h.strip()]
    server = DashboardServer(
        args.host,
        args.port,
        live,
        metrics,
        limits=http_limits(settings.http),
        allowed_hosts=(*allowed, *args.allow_host),
    )
    try:
        live.start()
        print(
            f"ipcount dashboard on {server.url} (reading {settings.topics.sink}"
            + ("" if args.no_late else f" + {settings.topics.late}")
            + " read_committed; Ctrl-C stops)",
            flush=True,
        )
        # SIGTERM stops it as Ctrl-C does.
        if threading.current_thread() is threading.main_thread():
            signal.signal(signal.SIGTERM, lambda *_: _stop(server))
        server.serve_forever(poll_interval=0.5)
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()
        live.stop()
    print("ipcount dashboard stopped", file=sys.stderr, flush=True)
    return 0


def _stop(server: DashboardServer) -> None:
    # shutdown() waits for serve_forever to return: call it from another thread.
    threading.Thread(target=server.shutdown, daemon=True).start()
