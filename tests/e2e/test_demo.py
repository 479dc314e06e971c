"""`ipcount demo` as a user runs it, on the default broker (Apache Kafka): the first line names
the broker, the live view prints `ipcount top` blocks (each window once, in window order) while
the traffic flows, and the demo ends with an exact check that covers every window it showed."""

from __future__ import annotations

import datetime as dt
import os
import re
import subprocess
import sys
from pathlib import Path

from ipcount.verify.ledger import Ledger

ROOT = Path(__file__).resolve().parents[2]
# `window START +5s  N requests from M IPs...` or `update START +5s  +K late...: N requests...`
HEADER = re.compile(r"^(window|update) (\S+) \+5s  (.*: )?(\d+) requests from (\d+) IPs")
ROW = re.compile(r"^(\d\d:\d\d:\d\dZ)  (\S+) +(\d+) +(\d+\.\d)%")


def _iso(ms: int) -> str:
    return dt.datetime.fromtimestamp(ms / 1000, tz=dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def test_demo_shows_windows_while_traffic_flows_then_an_exact_verify(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("IPCOUNT_")}
    env["IPCOUNT_CONFIG"] = str(ROOT / "conf" / "ipcount.toml")
    env["IPCOUNT_SPARK_MASTER"] = "local[2]"
    work = tmp_path / "demo"
    done = subprocess.run(
        [
            *(sys.executable, "-m", "ipcount", "demo", "--dir", str(work)),
            *("--rate", "400", "--duration", "30", "--ips", "6", "--top", "3"),
        ],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    out = done.stdout
    lines = out.splitlines()
    assert done.returncode == 0, out[-3000:] + done.stderr[-3000:]
    assert "Apache Kafka" in lines[0], lines[0]
    assert "the top 3 IPs of each window" in out
    assert "partition" not in out  # not the raw row stream of `ipcount consume`
    # The demo closes every window before its check: nothing is left open.
    (verdict,) = [ln for ln in lines if ln.startswith("isolation=read_committed")]
    assert " open=0 " in verdict, out[-3000:]
    assert verdict.endswith("missing=0 duplicates=0 wrong=0 exact=true"), verdict

    blocks: list[tuple[str, str, list[str]]] = []
    for line in lines:
        head = HEADER.match(line)
        if head:
            blocks.append((line, head.group(2), []))
        elif ROW.match(line):
            blocks[-1][2].append(line)
    for _, start, rows in blocks:
        assert 1 <= len(rows) <= 3
        assert all(row.startswith(start[11:19] + "Z") for row in rows)
    # Each window once, in window order. A window only late records reached (the generator's
    # late records are old) says so and appears when its first correction is committed.
    starts = [
        start
        for head, start, _ in blocks
        if head.startswith("window") and "no final result" not in head
    ]
    assert starts == sorted(set(starts))
    # Every window the traffic filled is shown (the generator's late records are an hour old).
    ledger = Ledger.load_all([str(work / "ledger.jsonl")])
    traffic = {_iso(start) for start, _ in ledger.counts} - {_iso(s) for s, _ in ledger.late_counts}
    assert traffic <= set(starts), sorted(traffic - set(starts))

    # Live: windows show while the traffic flows, not all at once after it.
    (traffic_done,) = [i for i, ln in enumerate(lines) if ln.startswith("[demo] traffic done")]
    during = [ln for ln in lines[:traffic_done] if ln.startswith("window ") and ln[7:27] in traffic]
    assert len(during) >= 2, out
