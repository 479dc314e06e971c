"""The job's own temp directory: the java.io.tmpdir of the driver JVM ipcount launches (and so
Spark's default scratch space), emptied of what a killed predecessor left in it.

A driver JVM writes to its temp dir: Spark's scratch space (spark.local.dir defaults to it):
`spark-*` directories (in local mode every RocksDB state store's working copy, as large as its
share of the state) and `blockmgr-*` (the shuffle files of the last batches); a copy of RocksDB's
native library (14.7 MB) and lz4's, `artifacts-*`, `faulthandler-*`. A JVM that exits deletes
them; a killed one (SIGKILL, the OOM killer) cannot, and nothing else ever does: each crash and
restart of a job leaves them in /tmp, its state's size and more. So each job (each checkpoint
location) gets a directory of its own under the system temp dir, and a job that starts while no
live process holds that directory's lock empties it first. It also removes the directories of
other jobs that no live process holds: a driver that exited normally left only the lock there,
and one killed for good (its checkpoint deleted, a test, a one-off run) left its files, which
nothing would ever empty. On a cluster this is the driver's directory: standalone workers, YARN
and Kubernetes give executors their own, and clean them.
"""

from __future__ import annotations

import fcntl
import hashlib
import logging
import os
import shutil
import tempfile
from pathlib import Path

from ipcount.checkpoint.offset_log import absolute_location
from ipcount.hostpaths import tree_bytes

__all__ = ["claim_temp_dir", "job_temp_dir"]

logger = logging.getLogger(__name__)

_LOCK = ".lock"
# Directories whose lock this process holds (an flock lock belongs to one open file: a second
# open of the same lock file in this process would conflict with the first).
_held: dict[Path, int] = {}


def job_temp_dir(checkpoint_location: str) -> Path:
    """The job's directory: TMP/ipcount-UID/job-DIGEST, DIGEST from the checkpoint location."""
    digest = hashlib.sha256(absolute_location(checkpoint_location).encode()).hexdigest()[:16]
    return Path(tempfile.gettempdir()) / f"ipcount-{os.getuid()}" / f"job-{digest}"


def claim_temp_dir(directory: Path) -> bool:
    """Create `directory`, lock it for the life of this process, and empty it of what a dead
    predecessor left; then remove the directories beside it that no live process holds. False
    when another live process holds the lock (two drivers of one checkpoint on this host): its
    files are left alone, and the caller must not use the directory (the next driver to hold the
    lock would empty it under the caller).

    Raises:
        OSError: the directory or its lock file cannot be created.
    """
    if directory in _held:
        return True
    fd = _lock(directory, make=True)
    if fd is None:
        logger.info(
            "%s is in use by another live driver: this one keeps its files in the system temp dir",
            directory,
        )
        return False
    _held[directory] = fd
    left = [p for p in directory.iterdir() if p.name != _LOCK]
    if left:
        size = _remove(left)
        logger.info(
            "removed %d entries (%.1f MB) that a killed driver left in %s",
            len(left),
            size / 1e6,
            directory,
        )
    _sweep(directory)
    return True


def _lock(directory: Path, *, make: bool) -> int | None:
    """An open, locked descriptor of directory's lock file (created if missing); None when
    another process holds the lock, or, unless `make` (create the directory), when the directory
    is gone. A lock taken on a lock file that a sweep removed meanwhile locks nothing: with
    `make` the directory is made and locked anew."""
    while True:
        if make:
            directory.mkdir(parents=True, exist_ok=True, mode=0o700)
        try:
            fd = os.open(directory / _LOCK, os.O_RDWR | os.O_CREAT, 0o600)
        except FileNotFoundError:
            if make:
                continue  # swept between the mkdir and the open
            return None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            return None
        try:
            same = os.stat(directory / _LOCK).st_ino == os.fstat(fd).st_ino
        except FileNotFoundError:
            same = False
        if same:
            return fd
        os.close(fd)
        if not make:
            return None


def _sweep(own: Path) -> None:
    """Remove the job directories beside `own` whose lock no live process holds."""
    for other in own.parent.glob("job-*"):
        if other == own or other in _held or not other.is_dir():
            continue
        try:
            fd = _lock(other, make=False)
            if fd is None:
                continue
            try:
                size = _remove(list(other.iterdir()))
                other.rmdir()
            finally:
                os.close(fd)
        except OSError as exc:
            logger.debug("could not remove %s: %s", other, exc)
            continue
        if size:
            logger.info("removed %s (%.1f MB): no live driver holds it", other, size / 1e6)


def _remove(paths: list[Path]) -> int:
    """Delete `paths` (files and trees); their bytes."""
    size = sum(tree_bytes(p)[0] if p.is_dir() else p.lstat().st_size for p in paths)
    for path in paths:
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path, ignore_errors=True)
        else:
            path.unlink(missing_ok=True)
    return size
