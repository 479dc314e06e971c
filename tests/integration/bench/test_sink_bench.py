"""`ipcount bench sink` at a small size against a real broker: a line per transaction size, then
the hand-over between two workers of one sink partition, with and without markers before it."""

from __future__ import annotations

import re
import subprocess
import sys

HAND_OVER = re.compile(
    r"^hand_over markers_before=(?P<markers>\d+) results=5000 "
    r"commit_after_the_other_worker=(?P<fenced>\d+\.\d{3})s commit_after_its_own=(?P<own>\d+\.\d{3})s "
    r"\(medians of 8 and 4\) slowest_after_the_other_worker=(?P<slowest>\d+\.\d{3})s$",
    re.M,
)


def test_the_sink_benchmark_times_the_hand_over_between_workers(bootstrap: str) -> None:
    proc = subprocess.run(
        [
            sys.executable, "-m", "ipcount", "--log-level", "WARNING", "bench", "sink",
            "--sizes", "1000", "--history", "0,300", "--bootstrap", bootstrap,
        ],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert re.search(r"^results=1000 encode=\S+ .* committed_results_per_s=", proc.stdout, re.M)
    fence = re.search(
        r"^fence_predecessors ids=6 seconds=(\d+\.\d{3}) \(median of 5\) slowest=(\d+\.\d{3})$",
        proc.stdout,
        re.M,
    )
    assert fence and 0 < float(fence[1]) <= float(fence[2]), proc.stdout
    lines = [m.groupdict() for m in HAND_OVER.finditer(proc.stdout)]
    assert [line["markers"] for line in lines] == ["0", "300"], proc.stdout
    for line in lines:
        assert 0 < float(line["own"]) and 0 < float(line["fenced"]) <= float(line["slowest"]), line
