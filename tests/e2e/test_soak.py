"""`ipcount soak` end to end, short: a live job restarted by SIGTERM and then SIGKILL while data
flows, one sample line per interval with the figures a long soak watches, and an exact output."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from ipcount.local_pipeline.children import child_env

ROOT = Path(__file__).resolve().parents[2]


def test_a_short_soak_restarts_the_job_reports_each_interval_and_is_exact(
    tmp_path: Path, broker_kind: str
) -> None:
    if os.environ.get("IPCOUNT_TEST_BOOTSTRAP"):
        pytest.skip("the soak starts its own broker here")
    env = child_env()
    env["IPCOUNT_BROKER_KIND"] = broker_kind
    # Snapshots every few versions and short retention, so even this short run snapshots and
    # purges (the state figures must show it).
    sets = [
        "spark.conf.spark.sql.streaming.minBatchesToRetain=10",
        "spark.conf.spark.sql.streaming.stateStore.maintenanceInterval=2s",
        "spark.conf.spark.sql.streaming.stateStore.minDeltasForSnapshot=5",
    ]
    # A restart every 10 s: less than a job takes to start and commit its first batch (~13 s on 2
    # cores alone, 28-36 s beside other tests), so each restart waits for that batch (a job
    # restarted sooner would never commit anything): 100 s of traffic leave room for two or more.
    # A sample every 15 s: four or more.
    run = subprocess.run(
        [sys.executable, "-m", "ipcount", "--config", str(ROOT / "conf" / "ipcount.toml"),
         *(a for s in sets for a in ("--set", s)),
         "soak", "--work-dir", str(tmp_path), "--duration", "100", "--rate", "200",
         "--restart-every", "10", "--report-every", "15", "--ips", "50",
         "--trigger-interval", "0.5"],
        env=env, cwd=ROOT, capture_output=True, text=True, timeout=900,
    )  # fmt: skip
    out = run.stdout
    assert run.returncode == 0, out[-4000:] + run.stderr[-4000:]
    assert re.search(r"missing=0 duplicates=0 wrong=0 exact=true unplanned_exits=0$", out), out
    assert "[soak] SIGTERM to job 1" in out and "[soak] SIGKILL to job 2" in out, out
    samples = [json.loads(line) for line in next(tmp_path.glob("soak-*/samples.jsonl")).open()]
    assert len(samples) >= 4, samples
    # Each start is measured to its first committed batch (none was stopped before it), and the
    # last sample is healthy.
    firsts = [s for sample in samples for s in sample["restart_to_first_batch_s"]]
    restarts = [how for sample in samples for how in sample["restarts"]]
    assert len(restarts) >= 2 and len(firsts) == 1 + len(restarts), (restarts, firsts)
    assert all(0 < s < 240 for s in firsts), firsts
    last = samples[-1]
    assert last["health"].startswith("200 ok"), last
    assert last["snapshots"] > 0 and last["snapshot_version"] > 0, last
    assert last["driver_rss"] > 0 and last["fds"] > 0 and last["checkpoint_bytes"] > 0, last
    assert last["progress_records"] > 0, last
    assert "sample age=" in out
