"""`ipcount bench costs`: the CPU each step of a counting read task costs per record at steady
state, measured on records pre-loaded to a real broker with the job's own functions, and the
JVM side's per-stage figures from one run of the job over them (bench process)."""

from __future__ import annotations

import argparse
import cProfile
import dataclasses
import io
import os
import pstats
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, TypeVar

import pyarrow as pa
from confluent_kafka import Message

from ipcount.bench.measure import RunFigures, RunKnobs, fmt_num, plan_preload
from ipcount.bench.workspace import bench_env
from ipcount.source.combiner import Combiner
from ipcount.source.counting_task import batch_rules, read_task
from ipcount.source.native_reader import read_values, uses_native_reader
from ipcount.source.offsets import OffsetRange
from ipcount.source.options import SourceOptions, parse_options, source_options
from ipcount.source.partition_reader import message_values, read_chunks, values_array

if TYPE_CHECKING:
    from ipcount.config import Settings

__all__ = ["COST_ROWS", "run_costs"]

# The table's rows in order: (key, label, what it covers).
COST_ROWS = (
    ("fetch", "librdkafka fetch (its own threads)",
     "the process's CPU less the task thread's while it read: fetch, decompress, queue"),
    ("native", "native read: values into Arrow buffers",
     "native_reader.read_values in the task's thread: librdkafka's batches, one data buffer"),
    ("consume", "consume(): Message objects",
     "read_chunks in the task's thread less the two rows below: consume(), one Message each"),
    ("value", ".value() of each message", "partition_reader.message_values"),
    ("arrow", "Arrow binary array", "partition_reader.values_array"),
    ("decode", "UTF-8 check", "null mask, cast to string (Arrow validates UTF-8)"),
    ("match", "line grammar (whole line)", "the compiled walk, else RE2 (LINE_PATTERN_RE2)"),
    ("prefix", "prefix capture (IP and time text)", "the first space and first quote; slices"),
    ("scan", "prefix scan (compiled): both texts, grouped",
     "ChunkParser._scanned: the helper cuts and groups; each distinct text decided (IP, time)"),
    ("clients", "IP canonicalisation", "dictionary-encode the IP texts; client_ip per new text"),
    ("times", "time parse ($time_local)",
     "dictionary-encode the time texts; parse_time_local per new text"),
    ("verdicts", "verdicts", "the verdict, event time and client columns (numpy)"),
    ("combine", "combine: window, late, group-by per chunk", "Combiner.add less the parse"),
    ("merge", "task merge: group-by, sort, output rows", "Combiner.result"),
    ("handoff", "hand-off to the JVM (Arrow IPC write)",
     "pyspark's records_to_arrow_batches and ArrowStreamSerializer into memory (no socket)"),
)  # fmt: skip
# cProfile's functions whose cumulative time is a row, by (module file, function name).
_PROFILED = {
    "decode": ("arrow_parse.py", "_decode"),
    "match": ("arrow_parse.py", "_match_lines"),
    "prefix": ("arrow_parse.py", "_prefix_fields"),
    "scan": ("arrow_parse.py", "_scanned"),
    "clients": ("arrow_parse.py", "_clients"),
    "times": ("arrow_parse.py", "_event_times"),
    "verdicts": ("arrow_parse.py", "_verdicts"),
}
_ADD, _PARSE = ("combiner.py", "add"), ("arrow_parse.py", "parse")
_T = TypeVar("_T")


@dataclass
class _Costs:
    """CPU seconds per row key, over `records` records."""

    records: int = 0
    seconds: dict[str, float] = field(default_factory=dict)
    chunks: int = 0

    def add(self, key: str, seconds: float) -> None:
        self.seconds[key] = self.seconds.get(key, 0.0) + seconds

    def us(self, key: str) -> float:
        return self.seconds.get(key, 0.0) * 1e6 / self.records if self.records else 0.0


def _timed(costs: _Costs, key: str, step: Callable[[], _T]) -> _T:
    """`step()`, its CPU time (this thread's) added to row `key`."""
    t0 = time.thread_time()
    out = step()
    costs.add(key, time.thread_time() - t0)
    return out


def _hand_off(options: SourceOptions, batches: Iterable[pa.RecordBatch]) -> int:
    """What pyspark's data source worker does with a read task's batches before the socket:
    check them against the schema and write them as an Arrow stream. Returns the bytes."""
    from pyspark.sql.pandas.serializers import ArrowStreamSerializer
    from pyspark.sql.worker.plan_data_source_read import records_to_arrow_batches

    from ipcount.source.data_source import KafkaDataSource
    from ipcount.source.schema import COUNTS_SCHEMA

    source = KafkaDataSource({"subscribe": ",".join(options.topics)})
    out = io.BytesIO()
    checked = records_to_arrow_batches(iter(batches), 10_000, COUNTS_SCHEMA, source)
    ArrowStreamSerializer(write_start_stream=True).dump_stream(checked, out)
    return out.tell()


def _profiled_task(options: SourceOptions, rng: OffsetRange, costs: _Costs) -> None:
    """One read task of output=counts, step by step as counting_task.read_task runs it: the
    per-record steps timed directly, the chunk steps (parse, combine) under cProfile."""
    combiner = Combiner(batch_rules(options, None, None), native=options.native_helpers != "off")
    profile = cProfile.Profile(time.thread_time)

    def convert(msgs: list[Message]) -> pa.Array:  # partition_reader.chunk_values, timed
        values = _timed(costs, "value", lambda: message_values(msgs))
        costs.records += len(msgs)
        costs.chunks += 1
        return _timed(costs, "arrow", lambda: values_array(values))

    def converting() -> float:
        return costs.seconds.get("value", 0.0) + costs.seconds.get("arrow", 0.0)

    proc0, thread0 = time.process_time(), time.thread_time()
    native = uses_native_reader(options)
    chunks = read_values(options, rng) if native else read_chunks(options, rng, convert)
    while True:
        t0, c0 = time.thread_time(), converting()
        array = next(chunks, None)
        costs.add("native" if native else "consume", time.thread_time() - t0 - (converting() - c0))
        if array is None:
            break
        if native:
            costs.records += len(array)
            costs.chunks += 1
        profile.runcall(combiner.add, array)
    result = _timed(costs, "merge", combiner.result)
    _timed(costs, "handoff", lambda: _hand_off(options, [result]))
    costs.add("fetch", (time.process_time() - proc0) - (time.thread_time() - thread0))
    stats = pstats.Stats(profile)
    cumulative = {
        (os.path.basename(path), name): ct
        for (path, _, name), (_, _, _, ct, _) in stats.stats.items()  # type: ignore[attr-defined]
    }
    for key, where in _PROFILED.items():
        costs.add(key, cumulative.get(where, 0.0))
    costs.add("combine", cumulative.get(_ADD, 0.0) - cumulative.get(_PARSE, 0.0))


def _plain_task(options: SourceOptions, rng: OffsetRange) -> float:
    """Process CPU seconds of the same read task run as the job runs it, unprofiled."""
    t0 = time.process_time()
    _hand_off(options, read_task(options, (rng,), None, None, None))
    return time.process_time() - t0


def _python_side(
    options: SourceOptions, topic: str, ends: dict[int, int]
) -> tuple[_Costs, dict[str, float]]:
    """(the profiled steps over every partition, the unprofiled read's CPU seconds through the
    native reader where it is built and through confluent-kafka's messages), each partition one
    task as a batch of that size would have it, after a warm-up read."""
    first = next(iter(ends))
    _plain_task(options, OffsetRange(topic, first, 0, min(2_000, ends[first])))
    costs = _Costs()
    for partition, end in ends.items():
        _profiled_task(options, OffsetRange(topic, partition, 0, end), costs)
    plain: dict[str, float] = {}
    paths = {"native": options, "messages": dataclasses.replace(options, native_helpers="off")}
    ranges = [OffsetRange(topic, p, 0, end) for p, end in ends.items()]
    for path, opts in paths.items():
        if path == "native" and not uses_native_reader(opts):
            continue
        plain[path] = sum(_plain_task(opts, rng) for rng in ranges)
    return costs, plain


def _ends(settings: Settings) -> dict[int, int]:
    from confluent_kafka import Consumer, TopicPartition

    from ipcount.kafka.client import with_client_logging

    conf = dict(settings.kafka.to_librdkafka("consumer"))
    conf["group.id"] = "bench-costs-probe"
    probe = Consumer(with_client_logging(conf))
    try:
        topic = settings.topics.source
        parts = probe.list_topics(topic, timeout=10).topics[topic].partitions
        return {
            p: probe.get_watermark_offsets(TopicPartition(topic, p), timeout=10)[1]
            for p in sorted(parts)
        }
    finally:
        probe.close()


def _row(label: str, us: float | None, note: str) -> str:
    return f"| {label:<44} | {fmt_num(us, 2):>6} | {note} |"


def _python_rows(costs: _Costs, plain_s: dict[str, float]) -> list[str]:
    rows = [_row(label, costs.us(key), note) for key, label, note in COST_ROWS]
    total = sum(costs.us(key) for key, _, _ in COST_ROWS)
    rows.append(_row("Python read task, sum of the steps", total, "the rows above"))
    labels = {
        "native": "Python read task, unprofiled, native reader",
        "messages": "Python read task, unprofiled, Message path",
    }
    for path, seconds in plain_s.items():
        rows.append(
            _row(
                labels[path],
                seconds * 1e6 / costs.records,
                "counting_task.read_task and the hand-off, process CPU, no profiler",
            )
        )
    return rows


def _jvm_rows(fig: RunFigures) -> list[str]:
    """The job's run over the same records, from Spark's event log and progress (whole run: the
    first batch's JIT warm-up included), per record."""
    n, st, ph, m = fig.records, fig.stages, fig.phases, fig.job.memory

    def us(seconds: float | None) -> float | None:
        return None if seconds is None else seconds * 1e6 / n

    def staged(seconds: float) -> float | None:
        """A figure of Spark's event log: none without one (--no-event-log)."""
        return us(seconds) if st.found else None

    state = ph.state_updates + ph.state_removals + ph.state_commit
    return [
        _row("JVM map tasks (CPU)", staged(st.task_cpu.get("map", 0.0)),
             "Arrow from the Python worker, partial aggregation, shuffle write"),
        _row("  of which shuffle write (wall)", staged(st.shuffle_write),
             "Spark's shuffle write time"),
        _row("JVM reduce tasks (CPU)", staged(st.task_cpu.get("reduce", 0.0)),
             "shuffle read, state store, sink encode"),
        _row("  state store (wall)", us(state), "updates + removals + commit (progress)"),
        _row("driver: sink transaction (wall)", staged(st.driver_after),
             "after the batch's jobs: the query's marker in one Kafka transaction"),
        _row("JVM whole process (CPU)", us(m.cpu_jvm), "start-up included"),
        _row("Python workers (CPU)", us(m.cpu_workers),
             "the job's read tasks in Spark's Python workers, their start included"),
        _row("broker (CPU)", us(m.cpu_broker), "the local broker meanwhile (-: --bootstrap)"),
    ]  # fmt: skip


def run_costs(args: argparse.Namespace, settings: Settings, say: Callable[[str], None]) -> int:
    """Pre-load --records records (synth's generator), profile a counting read task of each
    partition, then (unless --no-job) run the job over them once; the table's lines go to
    `say`."""
    knobs = RunKnobs.from_args(args)
    with bench_env(settings, args.bootstrap, args.overrides, keep=args.keep) as env:
        plan = plan_preload(env, "costs", args)
        src = plan.settings
        ledger_path = env.workdir / "ledger.jsonl"
        loaded = plan.load(args.records, ledger_path)
        ends = _ends(src)
        load = os.getloadavg()
        say(
            f"costs: {loaded.records} records in {len(ends)} partitions ({args.ips} IPs, skew "
            f"{args.skew:g}, {args.event_rate:g} per event-time second); broker {env.bootstrap}; "
            f"load average {load[0]:.2f} {load[1]:.2f} on {os.cpu_count()} cores"
        )
        # The read tasks' options as the job's first batch has them (no offset log entry yet).
        opts = source_options(src, heartbeats=False, query_checkpoint=str(env.workdir / "ckpt"))
        options = dataclasses.replace(parse_options(opts), clean_range_markers=False)
        costs, plain_s = _python_side(options, src.topics.source, ends)
        say(
            f"costs: Python side: one read task per partition, {costs.chunks} chunks; CPU "
            "(thread time per step, cProfile inside parse and combine)"
        )
        say(_row("step", None, "what it covers").replace("|      - |", "| us/rec |"))
        say("|---|---:|---|")
        for line in _python_rows(costs, plain_s):
            say(line)
        if args.no_job:
            return 0
        fig = plan.measure(env, "costs", args.records, ledger_path, knobs)
        for line in _jvm_rows(fig):
            say(line)
        say(f"costs: the job over the same records: {fig.seconds:.2f} s; verify {fig.verify}")
        return 0 if fig.exact else 1
