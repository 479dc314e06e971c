"""The Flink comparison runs from the repository: its script names only its own files, and the
Flink job's build says what to install when Maven is missing."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
PEERS = ROOT / "ipcount" / "bench" / "peers"


def test_compare_sh_uses_only_files_beside_it() -> None:
    script = (PEERS / "compare.sh").read_text(encoding="utf-8")
    subprocess.run(["bash", "-n", str(PEERS / "compare.sh")], check=True)
    named = set(re.findall(r'"\$(?:H|HERE)/(\w[\w./-]*)"', script))
    assert named == {"load_input.py", "time_job.py", "flink/build.sh", "flink/run.sh"}, named
    assert all((PEERS / name).is_file() for name in named)
    assert "shared/" not in script


def test_the_flink_build_names_maven_when_it_is_missing(tmp_path: Path) -> None:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "dirname").symlink_to("/usr/bin/dirname")
    done = subprocess.run(
        ["/bin/bash", str(PEERS / "flink" / "build.sh")],
        env={"PATH": str(bin_dir), "HOME": str(tmp_path), "FLINK_PEER_HOME": str(tmp_path / "b")},
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode == 2, done.stdout + done.stderr
    assert "needs Maven 3.8+" in done.stderr and "apt-get install maven" in done.stderr
