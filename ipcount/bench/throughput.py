"""`ipcount bench throughput|sustained`: throughput of the whole pipeline (Kafka -> Spark job ->
transactional sink), exactness checked, and where its time went. Bench process side."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

from ipcount.bench.measure import RunFigures, RunKnobs, final_line, fmt_num, plan_preload
from ipcount.bench.options import Say, sustained_overrides

if TYPE_CHECKING:  # the bench machinery is imported when a benchmark runs, not by every CLI call
    from ipcount.config import Settings

__all__ = ["report_lines", "run_throughput"]


def _sustained_line(fig: RunFigures) -> str:
    """The steady-state line: sustained and warm events/s, launch -> visible, JVM CPU per 1M."""
    job = fig.job
    steady, warmed = job.sustained, job.warm
    return (
        f"bench: sustained_events_per_s={fmt_num(None if steady is None else steady.rate, 0)} "
        f"launch_to_visible_s={fig.launch_to_visible_s:.1f} startup_s={job.startup_s:.1f} "
        f"first_batch_s={fmt_num(job.first_batch_s)} "
        f"jvm_cpu_s_per_1M={fmt_num(fig.jvm_cpu_per_1m)} "
        f"warm_events_per_s={fmt_num(None if warmed is None else warmed.rate, 0)} ("
        + (
            f"sustained: {fig.phases.data_batches} data batch(es), needs 2 (more --records, or "
            "`ipcount bench sustained`)"
            if steady is None
            else f"sustained: the {steady.batches} data batches after the first, "
            f"{steady.records} records in {steady.seconds:.1f} s from its end to the last one's"
        )
        + (
            "; warm: needs 4 data batches"
            if warmed is None
            else f"; warm: the last {warmed.batches} data batches, {warmed.records} records in "
            f"{warmed.seconds:.1f} s from the end of the one before them (the JIT's and the "
            "Python workers' warm-up left out)"
        )
        + "; launch_to_visible: job process launch -> every window committed, visible to "
        "read_committed readers; jvm_cpu_s_per_1M: JVM CPU incl. start-up per 1M records)"
    )


def report_lines(fig: RunFigures, verbose: bool = False) -> list[str]:
    """The lines printed before the final one: start-up, phases, stages, state, memory."""
    from ipcount.bench.memory import fmt_mb

    job, ph, st = fig.job, fig.phases, fig.stages
    first = job.first_batch_s
    # The run's seconds outside the query's start-up and its batches: between them, and the stop.
    between = None if job.query_init_s is None else fig.seconds - job.query_init_s - ph.trigger
    lines = [
        f"bench: startup_s={job.startup_s:.1f} (process launch -> SparkSession ready) "
        f"first_batch_s={first if first is None else round(first, 1)} (query start -> first data "
        f"batch done, incl. Python workers' start) batches={ph.batches} data_batches="
        f"{ph.data_batches} in_batch_events_per_s={ph.batch_rate:.0f} "
        f"stop_s={job.exited - job.result['run_ended']:.1f}",
        _sustained_line(fig),
        f"bench: S_split_s query_init={fmt_num(job.query_init_s)} (query start -> first batch "
        f"begins: preflight, Spark's Python data source processes, initial offsets) "
        f"batches={ph.trigger:.1f} (sum of triggerExecution) between_and_stop="
        f"{fmt_num(between)}",
        "bench: phases_s "
        + " ".join(f"{k}={v:.1f}" for k, v in ph.phases.items())
        + f" (sum of durationMs over batches; triggerExecution={ph.trigger:.1f})",
    ]
    if st.found:
        add_batch = ph.phases.get("addBatch", 0.0)
        lines.append(
            f"bench: addBatch_s={add_batch:.1f} map_stages_s={st.wall.get('map', 0.0):.1f} "
            f"(source read + parse + partial aggregation) reduce_stages_s="
            f"{st.wall.get('reduce', 0.0):.1f} (state store + sink encode) driver_before_jobs_s="
            f"{st.driver_before:.1f} (source planning, sink writer set-up) driver_after_jobs_s="
            f"{st.driver_after:.1f} (sink: the query's marker per batch) other_s="
            f"{max(0.0, add_batch - st.jobs_wall - st.driver_before - st.driver_after):.1f}"
        )
        lines.append(
            f"bench: task_s map={st.task_run.get('map', 0):.1f} (JVM CPU "
            f"{st.task_cpu.get('map', 0):.1f}; the rest is mostly the Python source read) "
            f"reduce={st.task_run.get('reduce', 0):.1f} (JVM CPU "
            f"{st.task_cpu.get('reduce', 0):.1f}) gc={st.gc:.1f} tasks={st.tasks}"
        )
    lines.append(
        f"bench: state_s updates={ph.state_updates:.1f} removals={ph.state_removals:.1f} "
        f"commit={ph.state_commit:.1f} rows_peak={ph.state_rows_peak} "
        f"memory_peak_MB={ph.state_memory_peak / 2**20:.0f} dropped_rows={ph.dropped_rows}"
    )
    if fig.sink is not None:
        lines.append(fig.sink.line())
    m = job.memory
    lines.append(
        f"bench: peak_rss_MB jvm={fmt_mb(m.jvm)} python_driver={fmt_mb(m.driver)} "
        f"python_workers={fmt_mb(m.workers)} ({m.max_workers} processes; forked workers share "
        f"pages) total={fmt_mb(m.total)} samples={m.samples}"
    )
    busy, busy_steady = job.cores_busy(steady=False), job.cores_busy(steady=True)
    lines.append(
        f"bench: cores_busy data_batches={fmt_num(None if busy is None else busy.job, 2)} "
        f"steady={fmt_num(None if busy_steady is None else busy_steady.job, 2)} "
        f"of {m.machine_cores} (the machine's busy CPU less the local broker's while the "
        "counting query's data batches ran; steady: the first left out) "
        + (
            "-"
            if busy is None
            else f"machine={busy.machine:.2f} broker={fmt_num(busy.broker, 2)} "
            f"over={busy.seconds:.1f}s"
        )
    )
    lines.append(
        f"bench: cpu_s jvm={m.cpu_jvm:.1f} python_workers={m.cpu_workers:.1f} "
        f"python_driver={m.cpu_driver:.1f} (whole job process life, start-up included) "
        + (
            "broker=- (given --bootstrap: not sampled)"
            if m.cpu_broker is None
            else f"broker={m.cpu_broker:.1f} (the local broker meanwhile, on the same cores)"
        )
    )
    if verbose:
        for p in job.progress:
            d = p.get("durationMs") or {}
            lines.append(
                f"bench:   batch {p.get('batchId')} rows={p.get('numInputRows')} "
                + " ".join(f"{k}={v}" for k, v in sorted(d.items()))
            )
    lines.append(f"bench: verify {fig.verify}")
    return lines


def run_throughput(args: argparse.Namespace, settings: Settings, say: Say) -> int:
    """Pre-load N records (synth's generator, fixed historical event time), run the job with
    Trigger.AvailableNow in its own process until every window is committed, verify the sink
    against the ledger; each line of the report goes to `say`.

    The last line is `bench: records=N seconds=S events_per_s=R results=K exact=true
    sustained_events_per_s=X launch_to_visible_s=Y`, where S runs from the query's start on a
    ready SparkSession to its end (every window committed); loading and Spark start-up are
    excluded from S and reported on the lines before. X is the steady state: the records of the
    data batches after the first over the time from the first data batch's end to the last one's
    (`-` below two data batches; `ipcount bench sustained` loads 5M records by default to have
    several); Y runs from the job process's launch to the run's end, every window visible to
    read_committed readers.
    """
    from ipcount.bench.workspace import bench_env

    knobs = RunKnobs.from_args(args)
    with bench_env(settings, args.bootstrap, args.overrides, keep=args.keep) as env:
        plan = plan_preload(env, "bench", args, *sustained_overrides(args))
        say(
            f"bench: broker {env.bootstrap}{'' if env.own_broker else ' (given)'}; loading "
            f"{args.records} records into {plan.settings.topics.source} ({args.partitions} "
            f"partitions, {args.ips} IPs skew {args.skew:g}, {args.event_rate:g} records per "
            f"event-time second from {plan.start_ms})"
        )
        if args.keep:
            say(f"bench: work directory (kept): {env.workdir}")
        ledger_path = env.workdir / "ledger.jsonl"
        loaded = plan.load(args.records, ledger_path)
        say(
            f"bench: loaded records={loaded.records} load_s={loaded.seconds:.1f} "
            f"({loaded.rate:.0f}/s, not part of S); running the job (AvailableNow)"
        )
        fig = plan.measure(env, "bench", args.records, ledger_path, knobs)
        for line in report_lines(fig, args.verbose):
            say(line)
        say(final_line(fig))
    return 0 if fig.exact else 1
