"""A local checkpoint is written without forking a process per file: Spark's default checkpoint
file manager renames through Hadoop's FileContext, whose local file system runs `readlink` (a new
process, ~3 ms) twice for every rename: about twenty per micro-batch on the driver's critical
path, more in the state store's tasks, for as long as the job runs."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from ipcount.kafka.topics import ensure_topics


def _shim(bin_dir: Path, tool: str, log: Path) -> None:
    """`tool` on PATH that notes its arguments in `log`, then runs the real one."""
    real = shutil.which(tool)
    assert real, f"{tool} is not installed"
    shim = bin_dir / tool
    shim.write_text(f'#!/bin/sh\necho "$*" >> "{log}"\nexec "{real}" "$@"\n')
    shim.chmod(0o755)


def test_micro_batches_write_the_local_checkpoint_without_forking_readlink(
    make_settings, tmp_path, ipcount_cli, Feed
) -> None:  # type: ignore[no-untyped-def]
    settings = make_settings()
    ensure_topics(settings)
    feed = Feed(settings)
    feed.round(0, 40)  # 2,000 records: 8 batches of at most 250
    bin_dir, calls = tmp_path / "bin", tmp_path / "readlink.log"
    bin_dir.mkdir()
    _shim(bin_dir, "readlink", calls)
    env = {
        "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}",
        "IPCOUNT_JOB_MAX_OFFSETS_PER_TRIGGER": "250",
    }

    done = ipcount_cli(settings, "run", "--available-now", "--close-all-windows", env=env)

    assert done.returncode == 0, done.stderr[-3000:]
    checkpoint = Path(settings.job.checkpoint_location)
    batches = [p for p in (checkpoint / "commits").iterdir() if p.name.isdigit()]
    assert len(batches) >= 8, sorted(p.name for p in batches)
    assert any((checkpoint / "state").rglob("*.changelog")), "the state store wrote nothing"
    lines = calls.read_text().splitlines() if calls.exists() else []
    forks = [line for line in lines if str(checkpoint) in line]
    assert not forks, (
        f"{len(forks)} readlink processes for {len(batches)} committed batches, e.g. {forks[:3]}"
    )
    assert feed.verify(ipcount_cli, tmp_path).endswith("exact=true")
