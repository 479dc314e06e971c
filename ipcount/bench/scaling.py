"""`ipcount bench scaling`: events/s of the whole pipeline versus source partitions, distinct IPs,
maxOffsetsPerTrigger, shuffle partitions and state store (one AvailableNow run per cell, verified),
with where the time went and peak memory, as a table. Bench process side.
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
from dataclasses import dataclass
from typing import TYPE_CHECKING

from ipcount.bench.measure import (
    RunFigures,
    RunKnobs,
    final_line,
    fmt_num,
    measure_run,
    plan_preload,
)
from ipcount.bench.options import Say
from ipcount.errors import ConfigError

if TYPE_CHECKING:
    from ipcount.bench.workspace import BenchEnv
    from ipcount.config import Settings
    from ipcount.verify.ledger import Ledger

__all__ = ["Cell", "default_cells", "parse_variant", "run_scaling", "format_table"]


@dataclass(frozen=True)
class Cell:
    """One configuration: pre-load shape (None = the command's option) and setting overrides."""

    name: str
    partitions: int | None = None
    ips: int | None = None
    skew: float | None = None
    settings: tuple[str, ...] = ()
    env: tuple[tuple[str, str], ...] = ()
    axis: str = "baseline"


def default_cells() -> list[Cell]:
    """The baseline, then one axis varied at a time."""
    mopt = "job.max_offsets_per_trigger"
    return [
        Cell("baseline"),
        Cell("partitions=1", partitions=1, axis="partitions"),
        Cell("partitions=6", partitions=6, axis="partitions"),
        Cell("ips=1k-uniform", ips=1_000, skew=0.0, axis="ips"),
        Cell("ips=100k-uniform", ips=100_000, skew=0.0, axis="ips"),
        Cell("ips=1M-uniform", ips=1_000_000, skew=0.0, axis="ips"),
        Cell("maxOffsets=50k", settings=(f"{mopt}=50000",), axis="maxOffsetsPerTrigger"),
        Cell("maxOffsets=200k", settings=(f"{mopt}=200000",), axis="maxOffsetsPerTrigger"),
        Cell("maxOffsets=1M", settings=(f"{mopt}=1000000",), axis="maxOffsetsPerTrigger"),
        Cell("minPartitions=6", settings=("job.min_partitions=6",), axis="read tasks"),
        Cell("shuffle=1", settings=("spark.shuffle_partitions=1",), axis="shuffle"),
        Cell("shuffle=4", settings=("spark.shuffle_partitions=4",), axis="shuffle"),
        Cell("shuffle=8", settings=("spark.shuffle_partitions=8",), axis="shuffle"),
        Cell("store=hdfs", settings=("spark.state_store=hdfs",), axis="state store"),
    ]


def parse_variant(text: str) -> Cell:
    """`NAME:K=V[,K=V...]`: partitions=, ips=, skew= shape the pre-load; env.VAR=V goes to the
    job's environment (e.g. env.PYTHONPATH=/other/checkout to A/B code); anything else is an
    ipcount setting override (section.key=value, spark.conf.<key>=value).

    Raises:
        ConfigError: a malformed variant.
    """
    name, sep, rest = text.partition(":")
    if not sep or not name.strip():
        raise ConfigError(f"--variant {text!r}: expected NAME:K=V[,K=V...]")
    shape: dict[str, float] = {}
    settings: list[str] = []
    env: list[tuple[str, str]] = []
    for item in filter(None, (s.strip() for s in rest.split(","))):
        key, eq, value = item.partition("=")
        if not eq:
            raise ConfigError(f"--variant {text!r}: {item!r} is not K=V")
        try:
            if key in ("partitions", "ips"):
                shape[key] = int(value)
            elif key == "skew":
                shape[key] = float(value)
            elif key.startswith("env."):
                env.append((key[4:], value))
            elif "." in key:
                settings.append(item)
            else:
                raise ConfigError(f"--variant {text!r}: unknown key {key!r}")
        except ValueError:
            raise ConfigError(f"--variant {text!r}: bad number in {item!r}") from None
    return Cell(
        name.strip(),
        partitions=int(shape["partitions"]) if "partitions" in shape else None,
        ips=int(shape["ips"]) if "ips" in shape else None,
        skew=shape.get("skew"),
        settings=tuple(settings),
        env=tuple(env),
        axis="variant",
    )


@dataclass
class _Source:
    overrides: list[str]
    ledger: Ledger
    load_s: float


@dataclass
class _Row:
    cell: Cell
    fig: RunFigures
    shape: tuple[int, int, float]


def _select(args: argparse.Namespace) -> list[Cell]:
    cells = default_cells() + [parse_variant(v) for v in args.variant]
    if args.cells:
        wanted = [c.strip() for c in args.cells.split(",") if c.strip()]
        by_name = {c.name: c for c in cells}
        unknown = [w for w in wanted if w not in by_name]
        if unknown:
            raise ConfigError(f"--cells: unknown {', '.join(unknown)}; known: {', '.join(by_name)}")
        cells = [by_name[w] for w in wanted]
    elif args.variant:
        cells = [c for c in cells if c.axis in ("baseline", "variant")]
    return cells


def _load_source(
    env: BenchEnv, shape: tuple[int, int, float], args: argparse.Namespace, say: Say
) -> _Source:
    """Create a source topic of this shape on env's broker and pre-load --records records."""
    from ipcount.verify.ledger import Ledger

    part, ips, skew = shape
    plan = plan_preload(env, f"p{part}-i{ips}", args, partitions=part, ips=ips, skew=skew)
    path = env.workdir / f"ledger-p{part}-i{ips}-s{skew:g}.jsonl"
    loaded = plan.load(args.records, path)
    say(
        f"bench scaling: loaded {args.records} records, {part} partitions, "
        f"{ips} IPs skew {skew:g} in {loaded.seconds:.1f}s"
    )
    return _Source(plan.overrides, Ledger.load(path), loaded.seconds)


def run_scaling(args: argparse.Namespace, settings: Settings, say: Say) -> int:
    """Run every selected cell (`--repeat` times, interleaved); progress and the table, a line
    each to `say`."""
    from ipcount.bench.workspace import bench_env

    cells = _select(args)
    if args.list_cells:
        for c in cells:
            extra = " ".join([*c.settings, *(f"env.{k}={v}" for k, v in c.env)])
            say(
                f"{c.name:<18} axis={c.axis:<22} partitions={c.partitions or args.partitions} "
                f"ips={c.ips or args.ips} skew={args.skew if c.skew is None else c.skew:g} {extra}"
            )
        return 0
    if args.repeat < 1:
        raise ConfigError("--repeat must be at least 1")
    knobs = RunKnobs.from_args(args)
    rows: list[_Row] = []
    # noida-db re-persists everything it holds after writes, so its CPU (taken from the job's two
    # cores) grows with every topic loaded: measured 20 -> 68 CPU-s per 1M-record cell over one
    # 14-cell run on a shared broker, and late cells took ~1.5x as long as the same setup run
    # first. So with the local broker every cell gets a fresh one holding only its own source;
    # on a --bootstrap cluster the source of each shape is loaded once and re-read.
    fresh = not args.bootstrap

    def new_env() -> contextlib.AbstractContextManager[BenchEnv]:
        return bench_env(settings, args.bootstrap, args.overrides, keep=args.keep)

    with contextlib.ExitStack() as stack:
        shared = None if fresh else stack.enter_context(new_env())
        where = "a fresh local broker per cell" if shared is None else f"broker {shared.bootstrap}"
        say(
            f"bench scaling: {where}; {len(cells)} cells x {args.repeat}, "
            f"{args.records} records each"
            + ("" if shared is None else f"; work dir {shared.workdir}")
        )
        sources: dict[tuple[int, int, float], _Source] = {}
        for rep in range(args.repeat):
            for cell in cells:
                shape = (
                    cell.partitions or args.partitions,
                    cell.ips or args.ips,
                    args.skew if cell.skew is None else cell.skew,
                )
                with new_env() if shared is None else contextlib.nullcontext(shared) as env:
                    source = sources.get(shape)
                    if source is None:
                        source = _load_source(env, shape, args, say)
                        if shared is not None:
                            sources[shape] = source
                    fig = measure_run(
                        env, [*source.overrides, *cell.settings], f"{cell.name}-{rep}",
                        args.records, source.ledger, knobs, child_env=dict(cell.env),
                    )  # fmt: skip
                rows.append(_Row(cell, fig, shape))
                say(f"bench scaling: [{cell.name} #{rep + 1}] {final_line(fig)}")
        for line in format_table(rows):
            say(line)
        if args.repeat > 1:
            for line in _medians(rows):
                say(line)
    return 0 if all(r.fig.exact for r in rows) else 1


_COLUMNS = (
    ("cell", 16), ("part", 4), ("ips", 7), ("skew", 4), ("maxOff", 8), ("shuf", 4), ("store", 7),
    ("batch", 5), ("S", 6), ("ev/s", 7), ("sust/s", 6), ("results", 8), ("start", 5),
    ("first", 5), ("visible", 7),
    ("map", 5), ("reduce", 6), ("driver", 6), ("st.upd", 6), ("st.rm", 5), ("st.cmt", 6),
    ("mapCPU", 6), ("cpuJVM", 6), ("cpuPy", 5), ("cpuBrk", 6),
    ("jvmMB", 5), ("pyDrv", 5), ("pyWrk", 5), ("pyWk1", 5), ("exact", 5),
)  # fmt: skip


def _row_values(row: _Row) -> list[str]:
    fig, st, ph, mem = row.fig, row.fig.stages, row.fig.phases, row.fig.job.memory
    s = fig.settings
    mopt = s.job.max_offsets_per_trigger
    driver = max(0.0, ph.phases.get("addBatch", 0.0) - st.jobs_wall) if st.found else None
    first = fig.job.first_batch_s

    return [
        row.cell.name, str(row.shape[0]), str(row.shape[1]), f"{row.shape[2]:g}",
        str(mopt) if mopt else "all", str(s.spark.shuffle_partitions), s.spark.state_store,
        str(ph.batches), f"{fig.seconds:.1f}", f"{fig.rate:.0f}",
        fmt_num(fig.sustained_rate, 0), str(fig.results),
        fmt_num(fig.job.startup_s), fmt_num(first), fmt_num(fig.launch_to_visible_s),
        fmt_num(st.wall.get("map") if st.found else None),
        fmt_num(st.wall.get("reduce") if st.found else None), fmt_num(driver),
        fmt_num(ph.state_updates), fmt_num(ph.state_removals), fmt_num(ph.state_commit),
        fmt_num(st.task_cpu.get("map") if st.found else None), fmt_num(mem.cpu_jvm),
        fmt_num(mem.cpu_workers + mem.cpu_driver), fmt_num(mem.cpu_broker),
        f"{mem.jvm / 2**20:.0f}", f"{mem.driver / 2**20:.0f}", f"{mem.workers / 2**20:.0f}",
        f"{mem.one_worker / 2**20:.0f}", "true" if fig.exact else "false",
    ]  # fmt: skip


def format_table(rows: list[_Row]) -> list[str]:
    """The scaling table, one row per run, with a legend."""
    head = " ".join(f"{name:>{w}}" if i else f"{name:<{w}}" for i, (name, w) in enumerate(_COLUMNS))
    lines = ["", head]
    for row in rows:
        vals = _row_values(row)
        lines.append(
            " ".join(
                f"{v:>{w}}" if i else f"{v:<{w}}"
                for i, (v, (_, w)) in enumerate(zip(vals, _COLUMNS, strict=True))
            )
        )
    lines += [
        "",
        "S: query start -> every window committed (s; excludes loading and Spark start-up); "
        "ev/s = records / S; sust/s: records after the first data batch / its end -> the last "
        "data batch's end (- below 2 data batches); start: process launch -> SparkSession ready; "
        "first: query start -> first data batch done (includes Python workers' start); visible: "
        "job process launch -> every window committed (visible to read_committed readers);",
        "map: wall of the stages that read the source, parse and pre-aggregate; reduce: state "
        "store + sink encode stages; driver: addBatch outside Spark jobs (source planning, "
        "the sink's Kafka transaction); st.*: state store update / removal / commit time (s);",
        "mapCPU: JVM CPU of the map stages' tasks (partial aggregation of the combined rows, not "
        "the Python read, parse and combine); cpuJVM / cpuPy: CPU seconds of the job's JVM / all "
        "its Python processes over the whole run (start-up included): robust to other load, "
        "unlike wall times; cpuBrk: CPU seconds of the local broker meanwhile, taken "
        "from the same cores;",
        "jvmMB, pyDrv, pyWrk: peak RSS (MB) of the driver JVM (local mode: executors too), the "
        "Python driver, and all "
        "Python workers together (forked workers share pages: an upper bound); pyWk1: the "
        "largest single Python worker (MB; a sink task's holds its share of a batch's "
        "results).",
    ]
    return lines


def _medians(rows: list[_Row]) -> list[str]:
    by_cell: dict[str, list[RunFigures]] = {}
    for row in rows:
        by_cell.setdefault(row.cell.name, []).append(row.fig)
    lines = ["", "medians over repeats:"]
    for name, figs in by_cell.items():
        secs = [f.seconds for f in figs]
        steady = [r for f in figs if (r := f.sustained_rate) is not None]
        lines.append(
            f"  {name:<18} S={statistics.median(secs):.1f} (min {min(secs):.1f} max "
            f"{max(secs):.1f}) ev/s={statistics.median(f.rate for f in figs):.0f} "
            f"sust/s={fmt_num(statistics.median(steady) if steady else None, 0)} "
            f"visible={statistics.median(f.launch_to_visible_s for f in figs):.1f} n={len(figs)}"
        )
    return lines
