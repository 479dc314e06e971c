"""The throughput bench's figures from a finished run, without Spark: sustained (steady-state)
events/s from the job child's progress events, launch -> visible, JVM CPU per 1M records, the
report and final lines, the scaling table and `ipcount bench sustained`."""

from __future__ import annotations

import re
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from ipcount.bench.job_launcher import JobRun
from ipcount.bench.measure import RunFigures, final_line
from ipcount.bench.memory import CpuSample, MemoryPeaks, cores_busy
from ipcount.bench.options import sustained_overrides, validate
from ipcount.bench.report import StageTotals, phase_totals, sustained, warm
from ipcount.bench.scaling import Cell, _Row, format_table
from ipcount.bench.throughput import report_lines
from ipcount.cli import build_parser
from ipcount.config import load_settings

T0 = datetime(2026, 3, 1, 12, 0, tzinfo=UTC).timestamp()
# The final line's parser in tests/e2e/test_bench.py: the historical keys, in order, then the
# two appended ones.
FINAL = re.compile(
    r"^bench: records=(\d+) seconds=(\d+\.\d+) events_per_s=(\d+) results=(\d+) "
    r"exact=(true|false) sustained_events_per_s=(\d+|-) launch_to_visible_s=(\d+\.\d|-)$"
)


def _iso(t: float) -> str:
    """Spark's progress timestamp: UTC, millisecond precision, a Z suffix."""
    return datetime.fromtimestamp(t, UTC).strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3] + "Z"


def batch(
    batch_id: int,
    start_s: float,
    trigger_ms: int,
    rows: int,
    records: int | None = None,
    *,
    lag_s: float = 0.2,
    query: str = "q-counts",
) -> dict[str, Any]:
    """One progress event as ipcount.bench.timed_job records it: the listener's wall-clock `at` (the
    batch's end plus the listener's delivery lag) and Spark's progress JSON. `records`: the
    ipcount_quality observed metric (None: not observed)."""
    progress: dict[str, Any] = {
        "id": query,
        "batchId": batch_id,
        "numInputRows": rows,
        "timestamp": _iso(T0 + start_s),
        "durationMs": {"triggerExecution": trigger_ms, "addBatch": trigger_ms - 100},
        "stateOperators": [],
    }
    if records is not None:
        progress["observedMetrics"] = {
            "ipcount_quality": {"records": records, "heartbeats": rows - records}
        }
    end = T0 + start_s + trigger_ms / 1000
    return {"event": "progress", "at": end + lag_s, "progress": progress}


def run_events() -> list[dict[str, Any]]:
    """Three data batches (the first slow: Python workers start, the JIT warms up; it also
    carries a heartbeat), then the AvailableNow run's two flush heartbeats."""
    return [
        {"event": "started", "at": T0 - 1.0, "name": "ipcount"},
        batch(0, 0.0, 30_000, 500_001, 500_000),
        batch(1, 30.5, 12_000, 500_000, 500_000),
        batch(2, 43.0, 9_500, 250_000, 250_000),
        batch(3, 53.0, 1_500, 1, 0),
        batch(4, 55.0, 1_500, 1, 0),
        {"event": "terminated", "at": T0 + 57.0, "error": None},
    ]


def job_run(
    events: list[dict[str, Any]], cpu_jvm: float = 40.0, timeline: list[CpuSample] | None = None
) -> JobRun:
    result = {
        "status": 0,
        "process_start": T0 - 25.0,
        "session_ready": T0 - 8.0,
        "run_started": T0 - 5.0,
        "run_ended": T0 + 60.0,
        "events": events,
    }
    progress = [ev["progress"] for ev in events if ev["event"] == "progress"]
    memory = MemoryPeaks(jvm=2**30, driver=2**27, workers=2**28, total=2**31, samples=10)
    memory.cpu_jvm = cpu_jvm
    memory.timeline = list(timeline or [])
    return JobRun(0, T0 - 25.1, T0 + 62.0, result, memory, Path("job.log"), progress)


def figures(events: list[dict[str, Any]], records: int = 1_250_000, name: str = "x") -> RunFigures:
    job = job_run(events)
    settings = load_settings(None, env={}, use_default_path=False)
    return RunFigures(
        name, records, 420, True, "results=420 missing=0 duplicates=0 wrong=0 exact=true", job,
        phase_totals(job.progress), StageTotals(), settings,
    )  # fmt: skip


# -- sustained events/s -----------------------------------------------------------------------


def test_sustained_excludes_the_first_data_batch_and_the_flush_heartbeats() -> None:
    s = sustained(run_events())
    assert s is not None
    # Batches 1 and 2: 750,000 records from the end of batch 0 (30.0 s) to the end of batch 2
    # (43.0 + 9.5 s): the heartbeat-only batches 3 and 4 are not data batches.
    assert (s.records, s.batches) == (750_000, 2)
    assert s.seconds == pytest.approx(22.5)
    assert s.rate == pytest.approx(750_000 / 22.5)


def test_sustained_times_batches_by_spark_clock_not_by_listener_delivery() -> None:
    """A batch ends at its progress timestamp + triggerExecution; the listener's `at` lags by
    however long the event took to reach the Python listener (here 3 s for the first batch)."""
    events = run_events()
    events[1] = batch(0, 0.0, 30_000, 500_001, 500_000, lag_s=3.0)
    s = sustained(events)
    assert s is not None and s.seconds == pytest.approx(22.5)


def test_sustained_falls_back_to_the_listener_time_without_timestamp() -> None:
    events = run_events()
    del events[3]["progress"]["timestamp"]  # batch 2: ends at its `at`, 0.2 s after 52.5
    s = sustained(events)
    assert s is not None and s.seconds == pytest.approx(22.7)


def test_sustained_needs_two_data_batches() -> None:
    one = [batch(0, 0.0, 30_000, 1_000, 1_000), batch(1, 31.0, 1_500, 1, 0)]
    assert sustained(one) is None
    assert sustained([]) is None


def warming_events() -> list[dict[str, Any]]:
    """Nine data batches of 500,000 records that get faster as the JIT and the Python workers
    warm up (3.0 s, then 0.2 s less each, down to 1.0 s), then a flush heartbeat."""
    events: list[dict[str, Any]] = []
    start = 0.0
    for i, ms in enumerate([3000, 2800, 2600, 2400, 2000, 1000, 1000, 1000, 1000]):
        events.append(batch(i, start, ms, 500_000, 500_000))
        start += ms / 1000 + 0.5
    events.append(batch(9, start, 500, 1, 0))
    return events


def test_warm_is_the_second_half_of_the_data_batches() -> None:
    """A run's warm-up weighs on `sustained` (every data batch after the first); `warm` takes
    the later half alone: batches 5-8 here, from the end of batch 4 to the end of batch 8."""
    events = warming_events()
    w = warm(events)
    assert w is not None
    assert (w.records, w.batches) == (2_000_000, 4)
    # Each warm batch: 0.5 s between batches + 1.0 s of trigger.
    assert w.seconds == pytest.approx(6.0)
    s = sustained(events)
    assert s is not None and s.rate < w.rate


def test_warm_needs_four_data_batches() -> None:
    three = warming_events()[:3]
    assert sustained(three) is not None
    assert warm(three) is None
    assert warm(warming_events()[:4]) is not None


def test_a_single_unobserved_row_is_a_heartbeat_not_a_data_batch() -> None:
    """Without ipcount's observed metrics a batch's records are its numInputRows, but a batch of
    one row is taken for a heartbeat (the flush heartbeats are single-row batches)."""
    events = [
        batch(0, 0.0, 20_000, 400_000),
        batch(1, 21.0, 9_000, 400_000),
        batch(2, 31.0, 1_000, 1),
    ]
    s = sustained(events)
    assert s is not None and (s.records, s.batches) == (400_000, 1)
    assert s.seconds == pytest.approx(10.0)


def test_sustained_ignores_a_second_query_without_the_counting_metrics() -> None:
    """With job.dead_letter on, the dead-letter query's progress is recorded too: it reads the
    same records but is not the counting query (no ipcount_quality)."""
    events = run_events() + [batch(7, 60.0, 2_000, 1_250_000, query="q-dead-letter")]
    s = sustained(events)
    assert s is not None and s.records == 750_000 and s.seconds == pytest.approx(22.5)


# -- cores busy while data batches run ----------------------------------------------------------


def timeline(busy: float, idle: float, broker: float, until: float = 60.0) -> list[CpuSample]:
    """Samples every 0.5 s from T0 - 10 s: the machine `busy` cores while batches 0-2 run
    (0 .. 52.5 s), `idle` cores otherwise; the broker `broker` cores throughout."""
    out, machine, t = [], 100.0, T0 - 10.0
    while t <= T0 + until:
        out.append(CpuSample(t, machine, 7.0 + broker * (t - T0 + 10.0)))
        machine += 0.5 * (busy if T0 <= t < T0 + 52.5 else idle)
        t += 0.5
    return out


def test_cores_busy_is_the_machine_minus_the_broker_over_the_given_spans() -> None:
    samples = timeline(busy=1.9, idle=0.2, broker=0.1)
    got = cores_busy(samples, [(T0, T0 + 30.0), (T0 + 30.5, T0 + 42.5)])
    assert got is not None
    assert got.seconds == pytest.approx(42.0)
    assert (got.machine, got.broker, got.job) == pytest.approx((1.9, 0.1, 1.8))
    # Between samples the counters are interpolated: half a sample interval in, half the step.
    half = cores_busy(samples, [(T0 - 0.25, T0 + 0.25)])
    assert half is not None and half.machine == pytest.approx((0.2 + 1.9) / 2)


def test_cores_busy_needs_samples_around_a_span() -> None:
    samples = timeline(busy=1.9, idle=0.2, broker=0.1)
    assert cores_busy(samples, [(T0 + 100.0, T0 + 110.0)]) is None
    assert cores_busy(samples[:1], [(T0, T0 + 1.0)]) is None
    assert cores_busy(samples, []) is None
    no_broker = [CpuSample(s.at, s.machine_s, None) for s in samples]
    got = cores_busy(no_broker, [(T0, T0 + 30.0)])
    assert got is not None and got.broker is None and got.job == pytest.approx(1.9)


def test_a_run_reports_cores_busy_in_all_data_batches_and_in_the_steady_ones() -> None:
    """Batches 0-2 are the data batches (0 .. 52.5 s); steady leaves out batch 0 (0 .. 30 s);
    the flush heartbeats after them are not counted."""
    samples = timeline(busy=1.9, idle=0.2, broker=0.1)
    run = job_run(run_events(), timeline=samples)
    data, steady = run.cores_busy(steady=False), run.cores_busy(steady=True)
    assert data is not None and steady is not None
    assert data.seconds == pytest.approx(30.0 + 12.0 + 9.5)
    assert steady.seconds == pytest.approx(21.5)
    assert data.job == pytest.approx(1.8) and steady.job == pytest.approx(1.8)
    line = next(x for x in report_lines(figures_with(samples)) if x.startswith("bench: cores_busy"))
    assert line.startswith("bench: cores_busy data_batches=1.80 steady=1.80 of 2 "), line
    assert "machine=1.90 broker=0.10" in line, line


def test_cores_busy_prints_dashes_without_samples() -> None:
    line = next(x for x in report_lines(figures(run_events())) if x.startswith("bench: cores_busy"))
    assert line.startswith("bench: cores_busy data_batches=- steady=- of "), line


def figures_with(samples: list[CpuSample]) -> RunFigures:
    fig = figures(run_events())
    fig.job.memory.timeline = samples
    fig.job.memory.machine_cores = 2
    return fig


# -- launch -> visible, JVM CPU per 1M records --------------------------------------------------


def test_launch_to_visible_runs_from_the_job_process_start_to_the_run_end() -> None:
    fig = figures(run_events())
    assert fig.job.launch_to_visible_s == pytest.approx(85.0)
    assert fig.launch_to_visible_s == pytest.approx(85.0)


def test_jvm_cpu_is_scaled_to_one_million_records() -> None:
    assert figures(run_events(), records=1_250_000).jvm_cpu_per_1m == pytest.approx(32.0)
    assert figures(run_events(), records=5_000_000).jvm_cpu_per_1m == pytest.approx(8.0)


# -- printed lines ------------------------------------------------------------------------------


def test_final_line_keeps_its_keys_and_appends_sustained_and_launch_to_visible() -> None:
    line = final_line(figures(run_events()))
    assert line == (
        "bench: records=1250000 seconds=65.00 events_per_s=19231 results=420 exact=true "
        "sustained_events_per_s=33333 launch_to_visible_s=85.0"
    )
    match = FINAL.match(line)
    assert match and match.group(5) == "true"


def test_final_line_prints_a_dash_without_two_data_batches() -> None:
    events = [batch(0, 0.0, 30_000, 1_000, 1_000), batch(1, 31.0, 1_500, 1, 0)]
    line = final_line(figures(events, records=1_000))
    assert line.endswith(" exact=true sustained_events_per_s=- launch_to_visible_s=85.0"), line
    assert FINAL.match(line)


def test_report_lines_print_sustained_launch_to_visible_and_jvm_cpu_per_1m() -> None:
    lines = report_lines(figures(run_events()))
    steady = [line for line in lines if line.startswith("bench: sustained_events_per_s=")]
    assert len(steady) == 1, lines
    assert steady[0].startswith(
        "bench: sustained_events_per_s=33333 launch_to_visible_s=85.0 startup_s=17.1 "
        "first_batch_s=35.2 jvm_cpu_s_per_1M=32.0 warm_events_per_s=- ("
    ), steady[0]
    assert "750000 records in 22.5 s" in steady[0]
    # Three data batches are too few to tell a warm half.
    assert " warm_events_per_s=- " in steady[0], steady[0]


def test_report_lines_print_the_warm_rate_beside_the_sustained_one() -> None:
    lines = report_lines(figures(warming_events(), records=4_500_000))
    steady = next(line for line in lines if line.startswith("bench: sustained_events_per_s="))
    assert " warm_events_per_s=333333 (" in steady, steady
    assert "warm: the last 4 data batches, 2000000 records in 6.0 s" in steady, steady
    # The figures already printed keep their lines.
    assert lines[0].startswith("bench: startup_s=17.1 "), lines[0]
    assert any(line.startswith("bench: cpu_s jvm=40.0 ") for line in lines)


def test_report_lines_print_a_dash_without_two_data_batches() -> None:
    events = [batch(0, 0.0, 30_000, 1_000, 1_000), batch(1, 31.0, 1_500, 1, 0)]
    lines = report_lines(figures(events, records=1_000))
    steady = next(line for line in lines if line.startswith("bench: sustained_events_per_s="))
    assert steady.startswith("bench: sustained_events_per_s=- launch_to_visible_s=85.0 "), steady


# -- scaling table ------------------------------------------------------------------------------


def test_scaling_table_has_sustained_and_launch_to_visible_columns() -> None:
    few = [batch(0, 0.0, 30_000, 1_000, 1_000), batch(1, 31.0, 1_500, 1, 0)]
    rows = [
        _Row(Cell("baseline"), figures(run_events(), name="baseline-0"), (3, 2000, 1.1)),
        _Row(Cell("shuffle=1"), figures(few, records=1_000, name="shuffle=1-0"), (3, 2000, 1.1)),
    ]
    table = format_table(rows)
    head = table[1].split()
    body = [line.split() for line in table[2:4]]
    assert body[0][head.index("sust/s")] == "33333"
    assert body[0][head.index("visible")] == "85.0"
    assert body[0][head.index("ev/s")] == "19231"
    assert body[1][head.index("sust/s")] == "-"
    assert all(r[-1] == "true" for r in body) and len(head) == len(body[0]) == len(body[1])
    # Aligned, and no wider than needed for the extra two columns.
    assert len(table[1]) == len(table[2]) <= 210
    legend = "\n".join(table[4:])
    assert "sust/s" in legend and "visible" in legend


# -- ipcount bench sustained --------------------------------------------------------------------


@pytest.mark.parametrize(
    ("argv", "records"),
    [
        (["bench", "throughput"], 1_000_000),
        (["bench", "sustained"], 5_000_000),
        (["bench", "sustained", "--records", "200000"], 200_000),
        (["bench", "throughput", "--records", "7000"], 7_000),
        (["bench", "scaling"], 1_000_000),
    ],
)
def test_records_default_to_five_million_with_sustained(argv: list[str], records: int) -> None:
    args = build_parser().parse_args(argv)
    validate(args)
    assert args.records == records


@pytest.mark.parametrize(
    ("argv", "extra"),
    [
        (["bench", "throughput"], []),
        (["bench", "sustained"], ["job.max_offsets_per_trigger=500000"]),
        (["--set", "job.max_offsets_per_trigger=200000", "bench", "sustained"], []),
    ],
)
def test_sustained_reads_the_backlog_in_batches_of_half_a_million(
    argv: list[str], extra: list[str]
) -> None:
    """The job's default reads a backlog in one batch; `sustained` measures the batches after
    the first, so it caps them unless the user's own --set does."""
    args = build_parser().parse_args(argv)
    validate(args)
    assert sustained_overrides(args) == extra


def test_sustained_takes_no_latency_option() -> None:
    with pytest.raises(SystemExit):
        build_parser().parse_args(["bench", "sustained", "--rates", "1000"])


def test_scaling_medians_over_repeats_include_sustained_and_launch_to_visible() -> None:
    from ipcount.bench.scaling import _medians

    few = [batch(0, 0.0, 30_000, 1_000, 1_000), batch(1, 31.0, 1_500, 1, 0)]
    rows = [
        _Row(Cell("baseline"), figures(run_events(), name="baseline-0"), (3, 2000, 1.1)),
        _Row(Cell("baseline"), figures(few, records=1_000, name="baseline-1"), (3, 2000, 1.1)),
        _Row(Cell("shuffle=1"), figures(few, records=1_000, name="shuffle=1-0"), (3, 2000, 1.1)),
    ]
    lines = _medians(rows)
    base = next(line for line in lines if line.strip().startswith("baseline "))
    # The median of the runs that have a sustained figure; "-" when none has one.
    assert " sust/s=33333 visible=85.0 n=2" in base, base
    shuffle = next(line for line in lines if line.strip().startswith("shuffle=1 "))
    assert " sust/s=- visible=85.0 n=1" in shuffle, shuffle


def test_in_batch_rate_counts_records_not_the_combined_rows() -> None:
    # Two data batches of 12 rows each, standing for 6,000 records, 2 s of batches in all; and a
    # heartbeat-only flush batch, which is left out.
    def batch(batch_id: int, rows: int, records: int) -> dict:
        return {
            "batchId": batch_id,
            "numInputRows": rows,
            "durationMs": {"triggerExecution": 1000},
            "observedMetrics": {"ipcount_quality": {"records": records}},
            "stateOperators": [],
        }

    totals = phase_totals([batch(0, 12, 6000), batch(1, 12, 6000), batch(2, 1, 0)])
    assert totals.data_batches == 2
    assert totals.batch_rate == 6000.0
