"""`ipcount demo` as a user runs it, on the default broker (Apache Kafka): the first line names
the broker, the live view prints `ipcount top` blocks (each window once, in window order) while
the traffic flows, late records (seconds to a minute behind) show as a few compact corrections
blocks, and the demo ends with an exact check that covers every window it showed."""

from __future__ import annotations

import datetime as dt
import os
import re
import subprocess
import sys
from pathlib import Path

from ipcount.verify.ledger import Ledger

ROOT = Path(__file__).resolve().parents[2]
# `window START +5s  N requests from M IPs...`
HEADER = re.compile(r"^(window) (\S+) \+5s  (.*: )?(\d+) requests from (\d+) IPs")
ROW = re.compile(r"^(\d\d:\d\d:\d\dZ)  (\S+) +(\d+) +(\d+\.\d)%")
# `corrections  K late records for W earlier windows:`, then `  HH:MM:SSZ +5s  +k late: ...`
CORRECTIONS = re.compile(r"^corrections  (\d+) late records? for (\d+) earlier windows?:$")
CORRECTED = re.compile(r"^  (\d\d:\d\d:\d\dZ) \+5s  \+(\d+) late")


def _seconds_of_day(hms: str) -> int:
    hours, minutes, seconds = (int(x) for x in hms.rstrip("Z").split(":"))
    return hours * 3600 + minutes * 60 + seconds


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
            # 20 s of traffic from when the job is up: its first windows close while it flows.
            *("--rate", "400", "--duration", "20", "--ips", "6", "--top", "3"),
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
    # Each window once, in window order; corrections never interleave update blocks with them.
    starts = [start for _, start, _ in blocks]
    assert starts == sorted(set(starts))
    assert not [ln for ln in lines if ln.startswith("update ")]
    # Every window the traffic filled is shown.
    ledger = Ledger.load_all([str(work / "ledger.jsonl")])
    traffic = {_iso(start) for start, _ in ledger.counts}
    assert traffic <= set(starts), sorted(traffic - set(starts))
    # Late records are a shipper's retries, seconds to a minute behind: their corrections are
    # few compact blocks for windows of the last minute, not windows an hour old.
    heads = [CORRECTIONS.match(ln) for ln in lines if ln.startswith("corrections")]
    assert all(heads) and len(heads) <= len(starts), heads
    corrected = [m.group(1) for m in map(CORRECTED.match, lines) if m]
    assert sum(int(h.group(2)) for h in heads if h) == len(corrected)
    first = min(start for start, _ in ledger.counts)  # the traffic's first window
    assert min(starts) >= _iso(first - 70_000), (min(starts), _iso(first))
    for hms in corrected:
        behind = (first / 1000 - _seconds_of_day(hms)) % 86400
        assert behind <= 70 or behind > 86400 - 3600, (hms, _iso(first))

    # Live: windows show while the traffic flows, not all at once after it.
    (traffic_done,) = [i for i, ln in enumerate(lines) if ln.startswith("[demo] traffic done")]
    during = [ln for ln in lines[:traffic_done] if ln.startswith("window ") and ln[7:27] in traffic]
    assert len(during) >= 2, out
