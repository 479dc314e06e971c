"""`ipcount bench`: the benchmarks' one entry point, one subcommand each (throughput, sustained,
latency, scaling of the whole pipeline; the source and the sink alone). Bench process side."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING, Any

from ipcount.bench.options import SUSTAINED_BATCH_RECORDS, SUSTAINED_RECORDS, THROUGHPUT_RECORDS

if TYPE_CHECKING:
    from ipcount.config import Settings

__all__ = ["register"]


_FINAL = (
    "The last line is 'bench: records=N seconds=S events_per_s=R results=K exact=true "
    "sustained_events_per_s=X launch_to_visible_s=Y' (S excludes loading and Spark start-up; X "
    "leaves out the first data batch; Y runs from the job process's launch until every window is "
    "committed)."
)


def register(sub: Any) -> None:
    """Register `ipcount bench` and its subcommands on the ipcount subparsers."""
    bench = sub.add_parser(
        "bench",
        help="benchmarks: throughput, sustained, latency, scaling; the source and the sink alone",
        description="Benchmarks against a fresh local broker (broker.kind, on a free port) or "
        "--bootstrap; every pipeline run is verified exact against the generator's ledger. Global "
        "--config/--set apply to the job. See docs/benchmarks.md.",
    )
    kinds = bench.add_subparsers(dest="bench", required=True)
    _throughput(kinds)
    _sustained(kinds)
    _latency(kinds)
    _scaling(kinds)
    _source(kinds)
    _sink(kinds)
    _costs(kinds)


def _throughput(kinds: Any) -> None:
    _pre_loaded_run(
        kinds, "throughput", THROUGHPUT_RECORDS,
        help="pre-load N records, run the job (AvailableNow) until every window is committed",
        description="Pre-load --records records (synth's generator, fixed historical event time), "
        "run the job with --available-now in its own process until every window is committed, "
        "verify exactness. " + _FINAL,
    )  # fmt: skip


def _sustained(kinds: Any) -> None:
    _pre_loaded_run(
        kinds, "sustained", SUSTAINED_RECORDS, sustained=True,
        help="the throughput benchmark sized for a steady state (5M records, 500k per batch)",
        description=f"The throughput benchmark with --records defaulting to "
        f"{SUSTAINED_RECORDS:,} and a batch reading at most {SUSTAINED_BATCH_RECORDS:,} of them "
        "(unless --set job.max_offsets_per_trigger=...), so the last line's "
        "sustained_events_per_s= and cores_busy steady= cover several data batches (the report's "
        "sustained line adds warm_events_per_s=: the later half of them alone). " + _FINAL,
    )  # fmt: skip


def _latency(kinds: Any) -> None:
    p = kinds.add_parser(
        "latency",
        help="window end -> visible to a read_committed consumer, while synth --rate runs",
        description="Run the job (processing-time trigger) and `loadgen synth --rate R` for each "
        "rate, back to back; a read_committed consumer timestamps every result. Prints p50, p95, "
        "p99, min and max of (received - window end) per rate, beside the theoretical floor.",
    )
    _source_shape(p)
    p.add_argument(
        "--rates", default="1000,5000,20000",
        help="records/s, one phase each (default 1000,5000,20000)",
    )  # fmt: skip
    p.add_argument("--duration", type=float, default=60.0, help="seconds per rate (default 60)")
    p.add_argument(
        "--warmup", type=float, default=20.0,
        help="unmeasured warm-up at the first rate: at least this long and until the job has "
        "committed windows (default 20 s)",
    )  # fmt: skip
    _broker_options(p)
    p.set_defaults(func=_run_latency)


def _scaling(kinds: Any) -> None:
    p = _pre_loaded_run(
        kinds, "scaling", THROUGHPUT_RECORDS, per_cell=True, verbose=False, run=_run_scaling,
        help="events/s vs partitions, distinct IPs, maxOffsetsPerTrigger, shuffle partitions, "
        "state store; time per phase and peak memory, as a table",
        description="One verified AvailableNow run per cell, one thing varied at a time from the "
        "throughput benchmark's baseline; a fresh local broker per cell (with --bootstrap, each "
        "shape's source is loaded once and re-read).",
    )  # fmt: skip
    p.add_argument("--cells", help="comma list of cells to run (default: all; see --list-cells)")
    p.add_argument("--list-cells", action="store_true", help="print the cells and exit")
    p.add_argument(
        "--variant", action="append", default=[], metavar="NAME:K=V[,K=V]",
        help="extra cell: settings (spark.shuffle_partitions=2), spark.conf keys, env.VAR=..., "
        "partitions=, ips=, skew= (repeatable)",
    )  # fmt: skip
    p.add_argument(
        "--repeat", type=int, default=1, help="run the cells this many times, interleaved"
    )  # fmt: skip


def _source(kinds: Any) -> None:
    p = kinds.add_parser(
        "source",
        help="the Kafka source alone: Spark read rate next to raw confluent-kafka consumption",
        description="Pre-load N access records into a fresh topic; print the produce rate, raw "
        "confluent-kafka consumption, the source's executor read path without Spark, and Spark "
        "AvailableNow queries reading the whole topic (cold, then warm). Built-in default "
        "settings; --config/--set do not apply.",
    )
    p.add_argument("--records", type=int, default=1_000_000, help="records (default 1M)")
    p.add_argument("--partitions", type=int, default=3, help="topic partitions (default 3)")
    p.add_argument("--bootstrap", help="use this Kafka (default: a local IPCOUNT_BROKER_KIND one)")
    p.add_argument("--master", default="local[*]", help="Spark master (default local[*])")
    p.add_argument(
        "--max-offsets-per-trigger", type=int, default=0,
        help="source maxOffsetsPerTrigger (default: none)",
    )  # fmt: skip
    p.add_argument(
        "--spark-runs", type=int, default=2,
        help="Spark queries in one session (default 2: cold, warm)",
    )  # fmt: skip
    p.set_defaults(func=_run_source)


def _sink(kinds: Any) -> None:
    p = kinds.add_parser(
        "sink",
        help="the transactional sink alone: committed results/s for one sink task's N results",
        description="Encode N results and commit them in one Kafka transaction as a sink task "
        "does on its executor; per size. Then what a job's start spends fencing its six "
        "transactional ids (fence_predecessors, new ids). Then the hand-over: two Python "
        "workers commit the same sink partition in turn (as Spark's reused workers do), each "
        "commit after the other's, with --history markers of another query already in the "
        "progress topic. Built-in default settings; --config/--set do not apply.",
    )
    p.add_argument("--sizes", default="10000,100000,1000000", help="comma list of batch sizes")
    p.add_argument(
        "--history",
        default="0,25000",
        help="comma list: progress markers before the hand-over ('' skips it). The topic holds up "
        "to two hours of markers before compaction: ~4,300 for the default job at a live rate "
        "(two sink tasks' and the query's, a window every 5 s), ~25,000 with 16 sink partitions",
    )
    p.add_argument("--bootstrap", help="use this broker (default: a local IPCOUNT_BROKER_KIND one)")
    p.add_argument("--partitions", type=int, default=3, help="sink topic partitions (default 3)")
    p.set_defaults(func=_run_sink)


def _pre_loaded_run(
    kinds: Any,
    name: str,
    records: int,
    *,
    help: str,
    description: str,
    sustained: bool = False,
    per_cell: bool = False,
    verbose: bool = True,
    run: Any = None,
) -> argparse.ArgumentParser:
    """A benchmark that pre-loads --records (default `records`, per cell if `per_cell`) and
    measures AvailableNow runs of the job (`run`, default the throughput run): throughput,
    sustained, scaling, costs."""
    p = kinds.add_parser(name, help=help, description=description)
    _load_options(p, f"records{' per cell' if per_cell else ''} (default {records:,})")
    _run_options(p, verbose)
    p.set_defaults(func=run or _run_pipeline, sustained=sustained, records_default=records)
    return p


def _costs(kinds: Any) -> None:
    p = _pre_loaded_run(
        kinds, "costs", 500_000, verbose=False, run=_run_costs,
        help="CPU per record of each step of a read task (fetch, parse, combine, hand-off) and of "
        "the JVM side, as a table",
        description="Pre-load --records records (synth's generator), profile one counting read "
        "task per partition with the job's own functions (CPU time per step), then run the job "
        "over the same records once for the JVM side's per-stage figures (unless --no-job).",
    )  # fmt: skip
    p.add_argument("--no-job", action="store_true", help="the Python side only (no Spark run)")


def _load_options(p: argparse.ArgumentParser, records_help: str) -> None:
    """The pre-loaded source's shape."""
    p.add_argument("--records", type=int, help=records_help)
    _source_shape(p)
    p.add_argument("--skew", type=float, default=1.1, help="Zipf skew of IPs (default 1.1)")
    p.add_argument(
        "--event-rate", type=float, default=20_000.0,
        help="records per event-time second when pre-loading (default 20000)",
    )  # fmt: skip
    p.add_argument("--start", help="first event time, ISO 8601 or epoch ms (default 2026-01-01Z)")
    p.add_argument("--seed", type=int, default=1, help="generator seed (default 1)")


def _source_shape(p: argparse.ArgumentParser) -> None:
    """The source topic's partitions and the generator's IP pool (pre-loaded or live)."""
    p.add_argument("--partitions", type=int, default=3, help="source partitions (default 3)")
    p.add_argument("--ips", type=int, default=2000, help="client IP pool (default 2000)")


def _run_options(p: argparse.ArgumentParser, verbose: bool = True) -> None:
    """How the measured AvailableNow runs go."""
    _broker_options(p)
    p.add_argument(
        "--no-event-log", action="store_true",
        help="do not write Spark's event log (no per-stage figures)",
    )  # fmt: skip
    p.add_argument("--timeout", type=float, default=3600.0, help="per job run (default 3600 s)")
    if verbose:
        p.add_argument("-v", "--verbose", action="store_true", help="one line per micro-batch")


def _broker_options(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--bootstrap", help="use this Kafka (default: a local broker.kind broker on a free port)"
    )
    p.add_argument(
        "--spark-conf", action="append", default=[], metavar="KEY=VALUE",
        help="extra Spark setting for the job (repeatable)",
    )  # fmt: skip
    p.add_argument(
        "--keep", action="store_true", help="keep the work directory (logs, checkpoints)"
    )


def _run_pipeline(args: argparse.Namespace, settings: Settings) -> int:
    from ipcount.bench.throughput import run_throughput

    return _guarded(run_throughput, args, settings)


def _run_latency(args: argparse.Namespace, settings: Settings) -> int:
    from ipcount.bench.latency import run_latency

    return _guarded(run_latency, args, settings)


def _run_scaling(args: argparse.Namespace, settings: Settings) -> int:
    from ipcount.bench.scaling import run_scaling

    return _guarded(run_scaling, args, settings)


def _run_source(args: argparse.Namespace, settings: Settings) -> int:
    from ipcount.bench.source import run_source

    return _guarded(lambda a, _s, say: run_source(a, say), args, settings)


def _run_sink(args: argparse.Namespace, settings: Settings) -> int:
    from ipcount.bench.sink import run_sink

    return _guarded(lambda a, _s, say: run_sink(a, say), args, settings)


def _say(line: str) -> None:
    """What a benchmark reports goes to stdout, a line at a time as it comes."""
    print(line, flush=True)


def _run_costs(args: argparse.Namespace, settings: Settings) -> int:
    from ipcount.bench.costs import run_costs

    return _guarded(run_costs, args, settings)


def _guarded(run: Any, args: argparse.Namespace, settings: Settings) -> int:
    """Check the extra and the options, then run with SIGTERM as an interrupt (cleanup runs);
    the benchmark's lines are printed."""
    from ipcount.bench.job_launcher import sigterm_as_interrupt
    from ipcount.bench.options import validate
    from loadgen.extras import require

    require("ipcount bench", "bench", "psutil")
    validate(args)
    with sigterm_as_interrupt():
        return int(run(args, settings, _say))
