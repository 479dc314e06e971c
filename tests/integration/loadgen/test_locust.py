"""A short headless Locust run against `loadgen serve`: the records it caused match the service's
ledger, the topic, and the request count Locust reports."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from test_bench_support import (
    ROOT,
    clean_env,
    count_like_the_job,
    loadgen_cmd,
    read_topic,
    start_service,
    stop_service,
)

from ipcount.config import Settings
from ipcount.kafka.topics import ensure_topics
from ipcount.verify.ledger import Ledger
from loadgen.generator import IpPool

LOCUST = Path(sys.executable).parent / "locust"
# The locustfile builds its pool from these (never import it here: locust monkey-patches gevent
# into the importing process).
POOL_ENV = {
    "LOADGEN_LOCUST_IPS": "40",
    "LOADGEN_LOCUST_IPV6_SHARE": "0.25",
    "LOADGEN_LOCUST_SEED": "123",
}


@pytest.mark.slow
def test_locust_requests_match_the_ledger(settings: Settings, tmp_path: Path) -> None:
    ensure_topics(settings)
    ledger_file = tmp_path / "serve.jsonl"
    proc, url = start_service(
        [*loadgen_cmd(settings), "serve", "--port", "0", "--ledger", str(ledger_file)]
    )
    try:
        run = subprocess.run(
            [str(LOCUST), "-f", str(ROOT / "loadgen" / "locustfile.py"), "--headless",
             "-u", "10", "-r", "5", "-t", "12s", "--stop-timeout", "10", "--host", url,
             "--json-file", str(tmp_path / "locust"), "--only-summary"],
            capture_output=True, text=True, env={**clean_env(), **POOL_ENV}, timeout=90, cwd=tmp_path,
        )  # fmt: skip
    finally:
        rc, out, err = stop_service(proc)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    assert rc == 0, err

    # The final stats (the periodic CSV can miss the last requests).
    stats = json.loads((tmp_path / "locust.json").read_text())
    by_name = {row["name"]: row for row in stats}
    total = sum(row["num_requests"] for row in stats)
    assert sum(row["num_failures"] for row in stats) == 0
    assert total > 100 and {"/", "/products/[id]", "/cart", "/static/css/site.css"} <= set(by_name)

    ledger = Ledger.load(ledger_file)
    assert ledger.on_time == total and ledger.malformed == 0
    assert f"records={total} " in out
    topic = count_like_the_job(read_topic(settings), settings.job.max_record_bytes)
    assert topic.records == total and topic.counts == ledger.counts
    pool = set(IpPool(40, 0.0, 0.25, np.random.default_rng(123)).ips)
    assert {ip for _, ip in ledger.counts} <= pool
