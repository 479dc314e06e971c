"""`ipcount demo` as a user runs it: the whole pipeline, printed as `ipcount top` blocks (each
window once, in window order), ending with the exactness check and its exit status."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
HEADER = re.compile(r"^(window|update) (\S+) \+5s  (\d+) requests from (\d+) IPs")
ROW = re.compile(r"^(\d\d:\d\d:\d\dZ)  (\S+) +(\d+) +(\d+\.\d)%")


def test_demo_prints_top_blocks_then_an_exact_verify(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("IPCOUNT_")}
    env["IPCOUNT_CONFIG"] = str(ROOT / "conf" / "ipcount.toml")
    env["IPCOUNT_SPARK_MASTER"] = "local[2]"
    done = subprocess.run(
        [
            *(sys.executable, "-m", "ipcount", "demo", "--dir", str(tmp_path / "demo")),
            *("--rate", "400", "--duration", "8", "--ips", "6", "--top", "3"),
        ],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    out = done.stdout
    assert done.returncode == 0, out[-3000:] + done.stderr[-3000:]
    assert "the top 3 IPs of each window" in out
    assert "partition" not in out  # not the raw row stream of `ipcount consume`
    (verdict,) = [ln for ln in out.splitlines() if ln.startswith("isolation=read_committed")]
    assert verdict.endswith("missing=0 duplicates=0 wrong=0 exact=true"), verdict

    blocks: list[tuple[str, str, list[str]]] = []
    for line in out.splitlines():
        head = HEADER.match(line)
        if head:
            blocks.append((line, head.group(2), []))
        elif ROW.match(line):
            blocks[-1][2].append(line)
    assert len([b for b in blocks if b[0].startswith("window")]) >= 2, out
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
