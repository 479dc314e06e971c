"""A job killed with SIGKILL and started again leaves nothing behind in the temp directory: not
the Spark scratch directories that hold the state store's working copies and the shuffle files
of its last batches, not the copies of RocksDB's and lz4's native libraries (14.7 MB a start)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from ipcount.kafka.topics import ensure_topics

ROOT = Path(__file__).resolve().parents[2]


def _leftovers(tmp: Path) -> list[str]:
    """Every file under `tmp` but the lock files of the jobs' own temp dirs."""
    found = [p for p in tmp.rglob("*") if p.name != ".lock" and not p.is_dir()]
    return sorted(str(p.relative_to(tmp)) for p in found)


def test_a_killed_job_started_again_leaves_nothing_in_the_temp_dir(
    make_settings, tmp_path, ipcount_cli, ipcount_env, Feed
) -> None:  # type: ignore[no-untyped-def]
    settings = make_settings()
    ensure_topics(settings)
    feed = Feed(settings)
    feed.round(0, 20)
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    env = {"TMPDIR": str(tmp), "JAVA_TOOL_OPTIONS": f"-Djava.io.tmpdir={tmp}"}
    log = tmp_path / "killed.log"
    job = subprocess.Popen(
        [sys.executable, "-m", "ipcount", "run"],
        env=ipcount_env(settings, env),
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
        stderr=log.open("w"),
        start_new_session=True,
    )
    commits = Path(settings.job.checkpoint_location) / "commits"
    deadline = time.monotonic() + 180
    while not (commits.is_dir() and any(p.name.isdigit() for p in commits.iterdir())):
        assert job.poll() is None, log.read_text()[-3000:]
        assert time.monotonic() < deadline, log.read_text()[-3000:]
        time.sleep(0.2)
    os.killpg(job.pid, signal.SIGKILL)
    job.wait(30)
    killed = _leftovers(tmp)
    assert killed, "the killed run had written nothing to its temp dir yet"

    feed.round(20, 40)
    done = ipcount_cli(settings, "run", "--available-now", "--close-all-windows", env=env)

    assert done.returncode == 0, done.stderr[-3000:]
    assert _leftovers(tmp) == [], f"the killed run left {killed}"
    assert feed.verify(ipcount_cli, tmp_path).endswith("exact=true")
