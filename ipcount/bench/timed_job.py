"""The job under benchmark, in its own process: `ipcount run` (run_job) plus a listener that keeps
every progress event, timed; writes one JSON result file. Started by ipcount.bench.job_launcher."""

from __future__ import annotations

import time

_PROCESS_START = time.time()  # before the heavy imports: they are part of the start-up

import argparse  # noqa: E402
import json  # noqa: E402
import os  # noqa: E402
import sys  # noqa: E402
from collections.abc import Sequence  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any  # noqa: E402

__all__ = ["main", "STARTED_SUFFIX"]

# Written next to the result file once the query has started (the latency bench waits for it).
STARTED_SUFFIX = ".started"


def _listener(events: list[dict[str, Any]], started_path: Path) -> Any:
    from ipcount.observe.listener import ProgressListener

    class _Collect(ProgressListener):
        def onQueryStarted(self, event: Any) -> None:  # noqa: N802 - Spark hook
            events.append({"event": "started", "at": time.time(), "name": event.name})
            started_path.write_text(str(time.time()))

        def onQueryProgress(self, event: Any) -> None:  # noqa: N802 - Spark hook
            progress = json.loads(event.progress.json)
            events.append({"event": "progress", "at": time.time(), "progress": progress})

        def onQueryIdle(self, event: Any) -> None:  # noqa: N802 - Spark hook
            pass

        def onQueryTerminated(self, event: Any) -> None:  # noqa: N802 - Spark hook
            events.append({"event": "terminated", "at": time.time(), "error": event.exception})

    return _Collect()


def _pairs(items: Sequence[str], what: str) -> dict[str, str]:
    out = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep:
            raise SystemExit(f"{what} {item!r}: expected KEY=VALUE")
        out[key.strip()] = value.strip()
    return out


def main(argv: Sequence[str] | None = None) -> int:
    """python -m ipcount.bench.timed_job --result FILE [--config F] [--set K=V ...]
    [--spark-conf K=V ...] [--available-now] [--timeout S]"""
    parser = argparse.ArgumentParser(prog="python -m ipcount.bench.timed_job")
    parser.add_argument("--result", required=True, help="JSON result file to write")
    parser.add_argument("--config", help="ipcount settings file")
    parser.add_argument("--set", dest="overrides", action="append", default=[])
    parser.add_argument("--spark-conf", action="append", default=[])
    parser.add_argument("--available-now", action="store_true")
    parser.add_argument("--close-all-windows", action="store_true")
    parser.add_argument("--timeout", type=float)
    args = parser.parse_args(argv)

    from ipcount import logsetup
    from ipcount.config import RunMode, load_settings
    from ipcount.job.jvm_archive import finish_training
    from ipcount.job.supervisor import open_session, run_job

    logsetup.configure(os.environ.get("IPCOUNT_LOG_LEVEL", "INFO"))
    settings = load_settings(args.config, overrides=args.overrides)
    result_path = Path(args.result)
    imported = time.time()
    # As `ipcount run`: the first run of an install writes the JVM class archive when its JVM
    # exits (after the result), so a user whose first runs are benchmarks measures the job as it
    # starts from then on, not without the archive every time.
    mode = RunMode(available_now=args.available_now, close_all_windows=args.close_all_windows)
    # As `ipcount run` opens it: Python workers started ahead, the Kafka side of the start done
    # while the JVM starts.
    session, prepared = open_session(settings, mode, _pairs(args.spark_conf, "--spark-conf"))
    session_ready = time.time()
    events: list[dict[str, Any]] = []
    listener = _listener(events, result_path.with_name(result_path.name + STARTED_SUFFIX))
    session.streams.addListener(listener)
    conf = {
        key: session.conf.get(key, None)
        for key in (
            "spark.sql.shuffle.partitions",
            "spark.sql.streaming.stateStore.providerClass",
            "spark.master",
            "spark.driver.memory",
        )
    }
    run_started = time.time()
    status = 1
    try:
        status = run_job(
            settings, mode=mode, timeout=args.timeout, spark=session, prepared=prepared
        )
    finally:
        run_ended = time.time()
        session.streams.removeListener(listener)
        result = {
            "status": status,
            "pid": os.getpid(),
            "process_start": _PROCESS_START,
            "imported": imported,
            "session_ready": session_ready,
            "run_started": run_started,
            "run_ended": run_ended,
            "conf": conf,
            "events": events,
        }
        tmp = result_path.with_name(result_path.name + ".tmp")
        tmp.write_text(json.dumps(result))
        tmp.replace(result_path)
        session.stop()
        finish_training(session)
    return status


if __name__ == "__main__":
    sys.exit(main())
