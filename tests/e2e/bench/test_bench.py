"""`ipcount bench throughput` at a tiny size: pre-load, the real job (AvailableNow) in its own process,
verification, the start-up/phase/memory lines and the final exact=true line."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
FINAL = re.compile(
    r"^bench: records=(\d+) seconds=(\d+\.\d+) events_per_s=(\d+) results=(\d+) exact=(true|false)"
    r" sustained_events_per_s=(\d+|-) launch_to_visible_s=(\d+\.\d)$"
)


def test_bench_prints_exact_final_line(bootstrap: str) -> None:
    env = {**os.environ, "PYSPARK_PYTHON": sys.executable}
    proc = subprocess.run(
        [
            sys.executable, "-m", "ipcount", "--config", str(ROOT / "conf" / "ipcount.toml"),
            "--log-level", "WARNING", "--set", "spark.master=local[2]",
            "bench", "throughput", "--records", "6000", "--bootstrap", bootstrap, "--ips", "300",
        ],
        env=env, cwd=ROOT, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    out = proc.stdout.strip().splitlines()
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    match = FINAL.match(out[-1])
    assert match, out[-1]
    records, seconds, rate, results, exact, _sustained, visible = match.groups()
    assert (records, exact) == ("6000", "true")
    assert float(seconds) > 0 and int(rate) > 0 and int(results) > 0
    # Launch -> visible holds the job's start-up and S.
    assert float(visible) > float(seconds)
    text = "\n".join(out)
    assert re.search(r"^bench: startup_s=\d+\.\d .* first_batch_s=\d+\.\d", text, re.M), text
    assert re.search(
        r"^bench: sustained_events_per_s=(\d+|-) launch_to_visible_s=\d+\.\d startup_s=\d+\.\d "
        r"first_batch_s=\d+\.\d jvm_cpu_s_per_1M=\d+\.\d ",
        text,
        re.M,
    ), text
    assert re.search(r"^bench: phases_s latestOffset=.* addBatch=\d+\.\d", text, re.M), text
    assert re.search(
        r"^bench: addBatch_s=\S+ map_stages_s=\d+\.\d .* driver_after_jobs_s=\d", text, re.M
    ), text
    assert re.search(r"^bench: peak_rss_MB jvm=[1-9]\d* python_driver=[1-9]", text, re.M), text
    # No result passes through the driver: every sink record is counted by a sink task's marker.
    sink = re.search(
        r"^bench: sink results_through_driver=0 \(sink records (\d+), of which the sink tasks' "
        r"own markers count (\d+)\) slowest_task_s rows_and_encoding=\d+\.\d commit=\d+\.\d "
        r"worst_batch=\d+\.\d\d over ([1-9]\d*) batches",
        text,
        re.M,
    )
    assert sink and sink[1] == sink[2] == results, text
    # A given --bootstrap broker is not ours to sample: its CPU is reported as unknown.
    assert re.search(r"^bench: cpu_s jvm=[1-9].* broker=- ", text, re.M), text
    # Cores busy while the data batch ran, from the machine's CPU (the broker's unknown here).
    assert re.search(
        r"^bench: cores_busy data_batches=\d+\.\d\d steady=(\d+\.\d\d|-) of \d+ .* broker=- ",
        text,
        re.M,
    ), text
    assert f"results={results} missing=0 duplicates=0 wrong=0 exact=true" in text


def test_bench_scaling_gives_each_cell_a_fresh_local_broker() -> None:
    """No --bootstrap: every cell loads its source into its own noida-db (the broker's CPU grows
    with what it holds, so a shared one would slow later cells), and its CPU is reported."""
    env = {**os.environ, "PYSPARK_PYTHON": sys.executable}
    proc = subprocess.run(
        [
            sys.executable, "-m", "ipcount", "--config", str(ROOT / "conf" / "ipcount.toml"),
            "--log-level", "WARNING", "--set", "spark.master=local[2]",
            "bench", "scaling", "--cells", "baseline,shuffle=1", "--records", "3000",
            "--ips", "200", "--no-event-log",
        ],
        env=env, cwd=ROOT, capture_output=True, text=True, timeout=900,
    )  # fmt: skip
    text = proc.stdout
    assert proc.returncode == 0, text[-3000:] + proc.stderr[-3000:]
    assert "bench scaling: a fresh local broker per cell; 2 cells x 1" in text, text
    # Same shape, loaded twice: once into each cell's broker.
    assert len(re.findall(r"^bench scaling: loaded 3000 records, 3 partitions", text, re.M)) == 2
    runs = re.findall(
        r"^bench scaling: \[(\S+) #1\] bench: records=3000 .* exact=true "
        r"sustained_events_per_s=\S+ launch_to_visible_s=\S+$",
        text,
        re.M,
    )
    assert runs == ["baseline", "shuffle=1"], text
    header = next(line for line in text.splitlines() if line.startswith("cell "))
    brk = header.split().index("cpuBrk")
    rows = [
        line.split() for line in text.splitlines() if line.startswith(("baseline ", "shuffle=1 "))
    ]
    assert len(rows) == 2 and all(r[-1] == "true" for r in rows), text
    assert all(float(r[brk]) > 0 for r in rows), text


def test_memory_sampler_counts_the_broker_cpu_of_the_run_only() -> None:
    from ipcount.bench.memory import MemorySampler

    busy_until = 0.0
    with MemorySampler(os.getpid(), interval=0.05, broker_pid=os.getpid()) as sampler:
        import time

        busy_until = time.process_time() + 0.3
        while time.process_time() < busy_until:
            pass
    assert sampler.peaks.cpu_broker is not None and 0.25 <= sampler.peaks.cpu_broker < 5
    with MemorySampler(os.getpid(), interval=0.05) as unsampled:
        pass
    assert unsampled.peaks.cpu_broker is None
