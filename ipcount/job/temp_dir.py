"""The job's own temp directory: the java.io.tmpdir of the driver JVM ipcount launches (and so
Spark's default scratch space), emptied of what a killed predecessor left in it.

A driver JVM writes to its temp dir: Spark's scratch space (spark.local.dir defaults to it):
`spark-*` directories (in local mode every RocksDB state store's working copy, as large as its
share of the state) and `blockmgr-*` (the shuffle files of the last batches); a copy of RocksDB's
native library (14.7 MB) and lz4's, `artifacts-*`, `faulthandler-*`. A JVM that exits deletes
them; a killed one (SIGKILL, the OOM killer) cannot, and nothing else ever does: each crash and
restart of a job leaves them in /tmp, its state's size and more. So each job (each checkpoint
location) gets a directory of its own under the system temp dir, and a job that starts while no
live process holds that directory's lock empties it first. On a cluster this is the driver's
directory: standalone workers, YARN and Kubernetes give executors their own, and clean them.
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
    predecessor left. False when another live process holds the lock (two drivers of one
    checkpoint on this host): its files are left alone, and the caller must not use the
    directory (the next driver to hold the lock would empty it under the caller).

    Raises:
        OSError: the directory or its lock file cannot be created.
    """
    if directory in _held:
        return True
    directory.mkdir(parents=True, exist_ok=True, mode=0o700)
    fd = os.open(directory / _LOCK, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        logger.info(
            "%s is in use by another live driver: this one keeps its files in the system temp dir",
            directory,
        )
        return False
    _held[directory] = fd
    left = [p for p in directory.iterdir() if p.name != _LOCK]
    if left:
        size = sum(tree_bytes(p)[0] if p.is_dir() else p.lstat().st_size for p in left)
        for path in left:
            if path.is_dir() and not path.is_symlink():
                shutil.rmtree(path, ignore_errors=True)
            else:
                path.unlink(missing_ok=True)
        logger.info(
            "removed %d entries (%.1f MB) that a killed driver left in %s",
            len(left),
            size / 1e6,
            directory,
        )
    return True
