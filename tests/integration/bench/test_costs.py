"""`ipcount bench costs` at a small size: the per-record cost table of the read task's steps and
of the JVM side, against a real broker and the real job."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[3]
# Every step a user reads the table for (docs/benchmarks.md, "Cost per record").
STEPS = (
    "librdkafka fetch",
    "consume(): Message objects",
    ".value() of each message",
    "Arrow binary array",
    "UTF-8 check",
    "line grammar",
    "prefix capture",
    "IP canonicalisation",
    "time parse",
    "verdicts",
    "combine",
    "task merge",
    "hand-off to the JVM",
    "Python read task, sum of the steps",
    "Python read task, unprofiled",
    "JVM map tasks",
    "shuffle write",
    "JVM reduce tasks",
    "state store",
    "sink transaction",
    "Python workers",
)
ROW = re.compile(r"^\| (?P<step>[^|]+?) +\| +(?P<us>\d+\.\d\d) +\|", re.M)


def test_the_cost_table_has_a_figure_for_every_step(bootstrap: str) -> None:
    env = {**os.environ, "PYSPARK_PYTHON": sys.executable}
    proc = subprocess.run(
        [
            sys.executable, "-m", "ipcount", "--config", str(ROOT / "conf" / "ipcount.toml"),
            "--log-level", "WARNING", "--set", "spark.master=local[2]",
            # 30k records a task: its fixed costs (a consumer's start, its first fetch) are a small
            # share of the unprofiled row even on a loaded machine (at 10k a task, CI once saw
            # 8.54 us/record unprofiled against 3.31 profiled).
            "bench", "costs", "--records", "60000", "--partitions", "2", "--ips", "300",
            "--bootstrap", bootstrap,
        ],
        env=env, cwd=ROOT, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    rows = {m["step"]: float(m["us"]) for m in ROW.finditer(proc.stdout)}
    for step in STEPS:
        found = [name for name in rows if step in name]
        assert found, f"no row for {step!r} in:\n{proc.stdout}"
    # The steps are measured, not made up: the read path costs something per record, and the
    # sum of its steps is within reach of the same read timed without the profiler.
    total = next(v for k, v in rows.items() if "sum of the steps" in k)
    plain = next(v for k, v in rows.items() if "unprofiled" in k)
    assert total > 0 and plain > 0
    assert 0.5 * plain < total < 2.0 * plain, proc.stdout
    assert "exact=true" in proc.stdout, proc.stdout


# The rows only Spark's event log gives (per-stage task times, the driver's time after the jobs).
EVENT_LOG_ROWS = ("JVM map tasks", "shuffle write", "JVM reduce tasks", "sink transaction")
ANY_ROW = re.compile(r"^\| (?P<step>[^|]+?) +\| +(?P<us>-|\d+\.\d\d) +\|", re.M)


def test_no_event_log_leaves_the_per_stage_rows_empty(bootstrap: str) -> None:
    """--no-event-log: Spark writes no event log, so the rows it alone gives show `-`, not a
    figure; the job's other rows (progress, process CPU) are still measured."""
    env = {**os.environ, "PYSPARK_PYTHON": sys.executable}
    proc = subprocess.run(
        [
            sys.executable, "-m", "ipcount", "--config", str(ROOT / "conf" / "ipcount.toml"),
            "--log-level", "WARNING", "--set", "spark.master=local[2]",
            "bench", "costs", "--records", "5000", "--partitions", "1", "--ips", "100",
            "--bootstrap", bootstrap, "--no-event-log",
        ],
        env=env, cwd=ROOT, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    rows = {m["step"]: m["us"] for m in ANY_ROW.finditer(proc.stdout)}
    for step in EVENT_LOG_ROWS:
        found = [rows[name] for name in rows if step in name]
        assert found == ["-"], f"{step!r} in:\n{proc.stdout}"
    assert rows["JVM whole process (CPU)"] != "-", proc.stdout
    assert "exact=true" in proc.stdout, proc.stdout
