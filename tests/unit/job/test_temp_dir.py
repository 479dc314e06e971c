"""The job's own temp dir: one per checkpoint location, emptied at start of what a killed driver
left, never while another live driver holds it."""

from __future__ import annotations

import contextlib
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from ipcount.job import temp_dir
from ipcount.job.temp_dir import claim_temp_dir, job_temp_dir


@pytest.fixture(autouse=True)
def _release_locks():  # type: ignore[no-untyped-def]
    yield
    for fd in temp_dir._held.values():
        temp_dir.os.close(fd)
    temp_dir._held.clear()


@contextlib.contextmanager
def _locked_by_another_process(directory: Path) -> Iterator[None]:
    """A live process holds directory's lock while the block runs."""
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import fcntl, os, sys, time\n"
            f"fd = os.open({str(directory / '.lock')!r}, os.O_RDWR | os.O_CREAT)\n"
            "fcntl.flock(fd, fcntl.LOCK_EX)\nprint('locked', flush=True)\ntime.sleep(60)\n",
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "locked"
        yield
    finally:
        holder.kill()
        holder.wait()


def _left_by_a_killed_driver(directory: Path) -> None:
    (directory / "blockmgr-1" / "0c").mkdir(parents=True)
    (directory / "blockmgr-1" / "0c" / "shuffle_0_1_0.data").write_bytes(b"x" * 1000)
    (directory / "spark-2" / "StateStoreId(opId=0,partId=0)").mkdir(parents=True)
    (directory / "librocksdbjni123.so").write_bytes(b"\x7fELF")


def test_one_dir_per_checkpoint_location(tmp_path: Path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    monkeypatch.setattr(temp_dir.tempfile, "tempdir", None)
    a, b = job_temp_dir("/data/ckpt-a"), job_temp_dir("/data/ckpt-b")
    assert a != b and a.parent == b.parent and a.parent.parent == tmp_path
    assert job_temp_dir("file:///data/ckpt-a") != a  # another spelling is another location
    monkeypatch.chdir(tmp_path)
    assert job_temp_dir("ckpt") == job_temp_dir(str(tmp_path / "ckpt"))


def test_a_dead_drivers_files_are_removed_and_the_lock_kept(tmp_path: Path) -> None:
    directory = tmp_path / "job-1"
    directory.mkdir()
    _left_by_a_killed_driver(directory)

    assert claim_temp_dir(directory)

    assert sorted(p.name for p in directory.iterdir()) == [".lock"]
    assert claim_temp_dir(directory)  # again in this process: already held, nothing to do


def test_a_live_drivers_dir_is_left_alone(tmp_path: Path) -> None:
    directory = tmp_path / "job-1"
    directory.mkdir()
    with _locked_by_another_process(directory):
        _left_by_a_killed_driver(directory)

        assert not claim_temp_dir(directory)
        assert (directory / "blockmgr-1" / "0c" / "shuffle_0_1_0.data").is_file()
    # Once the holder is gone its files are a dead driver's.
    assert claim_temp_dir(directory)
    assert sorted(p.name for p in directory.iterdir()) == [".lock"]


def test_the_dirs_of_jobs_that_are_gone_are_removed(tmp_path: Path) -> None:
    # One checkpoint's driver exited normally (its dir holds only the lock), another's was killed
    # and its checkpoint deleted (tests, one-off runs): nothing will ever claim those two again.
    exited, killed = tmp_path / "job-a", tmp_path / "job-b"
    exited.mkdir()
    (exited / ".lock").touch()
    killed.mkdir()
    _left_by_a_killed_driver(killed)
    own = tmp_path / "job-c"

    assert claim_temp_dir(own)

    assert sorted(p.name for p in tmp_path.iterdir()) == ["job-c"]


def test_a_live_jobs_dir_is_not_swept(tmp_path: Path) -> None:
    other = tmp_path / "job-a"
    other.mkdir()
    with _locked_by_another_process(other):
        _left_by_a_killed_driver(other)

        assert claim_temp_dir(tmp_path / "job-b")

        assert (other / "blockmgr-1" / "0c" / "shuffle_0_1_0.data").is_file()


def test_a_dir_swept_while_being_claimed_is_claimed_anew(tmp_path: Path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    # Another start swept the directory between this one's open of the lock file and its lock:
    # the lock it got is of a file no longer there, so it claims the directory again.
    directory = tmp_path / "job-a"
    real_flock = temp_dir.fcntl.flock
    swept = []

    def flock_after_a_sweep(fd: int, op: int) -> None:
        if not swept:
            swept.append(True)
            temp_dir.shutil.rmtree(directory)
        real_flock(fd, op)

    monkeypatch.setattr(temp_dir.fcntl, "flock", flock_after_a_sweep)

    assert claim_temp_dir(directory)

    assert (directory / ".lock").is_file()
    held = temp_dir.os.fstat(temp_dir._held[directory])
    assert held.st_ino == (directory / ".lock").stat().st_ino
