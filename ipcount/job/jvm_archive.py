"""A class-data-sharing archive for the driver JVM that ipcount launches: Spark's classes mapped
from one file instead of found, read and verified in ~280 jars at every start."""

from __future__ import annotations

import hashlib
import logging
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from ipcount.hostpaths import cache_root, find_java

__all__ = ["JvmArchive", "plan_archive", "finish_training"]

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

logger = logging.getLogger(__name__)

# The JVM's own CDS messages (a class it cannot archive, an archive made for another class path
# that it then ignores) are not the user's business: sharing is an optimisation, never an error.
_QUIET = "-Xlog:cds=off -Xlog:cds+dynamic=off"
# How long a training run's JVM may take to write the archive when it exits (measured: ~8 s).
_DUMP_SECONDS = 120.0
_STALE_SECONDS = 3600.0
# An archive no start has used for this long is removed when another is trained (each is
# ~170 MB; every install, upgrade or option change trains its own). A start that uses one marks
# it used (its modification time), at most once an hour.
_UNUSED_SECONDS = 14 * 86400.0
_MARK_USED_SECONDS = 3600.0
# And however recently they were used, a training start leaves at most this many archives (the
# ones used last, its own included): installs made within days (virtualenvs, test checkouts,
# upgrades) trained eleven in one day here, 1.8 GB.
MAX_ARCHIVES = 4

_training: JvmArchive | None = None


@dataclass(frozen=True)
class JvmArchive:
    """Where the archive for one JVM, class path (one Spark install) and set of JVM options
    lives, and whether this start uses it or writes it (`training`: the archive does not exist
    yet)."""

    path: Path
    # SPARK_CONF_DIR for the launch: Spark puts it on the class path, and the JVM refuses to
    # archive a class path with a non-empty directory. ipcount reads spark-defaults.conf itself
    # (session_conf) and names log4j2.properties with a system property instead.
    conf_dir: Path
    training: bool

    @property
    def partial(self) -> Path:
        return self.path.with_name(f"{self.path.name}.tmp{os.getpid()}")

    def java_options(self, log4j: Path | None) -> str:
        """The options this start adds to spark.driver.extraJavaOptions."""
        opts = [
            f"-XX:ArchiveClassesAtExit={self.partial}"
            if self.training
            else f"-XX:SharedArchiveFile={self.path}",
            _QUIET,
        ]
        if log4j is not None:
            opts.append(f"-Dlog4j.configurationFile=file:{log4j}")
        return " ".join(opts)


def plan_archive(spark_home: Path, java_options: str, *, train: bool) -> JvmArchive | None:
    """The archive for a JVM launched from `spark_home` with `java_options`, or None: no java on
    the PATH, no jars, a cache that cannot be written, or no archive yet and `train` is False.

    The archive's name is a digest of the java binary, the class path and the options: the
    Spark home's path and, for each jar, its resolved path, size and modification time (what the
    JVM checks before it maps an archive). The JVM ignores an archive made for another class
    path, silently with the options used here, so each install of Spark (another virtualenv, a
    reinstall, CI's beside a user's) trains its own on its first normal exit, and a JVM or Spark
    upgrade makes a new one."""
    java, jars = find_java(), spark_home / "jars"
    java = java.resolve() if java is not None else None
    if java is None or not jars.is_dir():
        return None
    try:
        digest = hashlib.sha256()
        stat = java.stat()
        digest.update(f"{java}|{stat.st_size}|{stat.st_mtime_ns}|{java_options}".encode())
        digest.update(f"|{os.path.abspath(spark_home)}".encode())
        for jar in sorted(jars.iterdir()):
            info = jar.stat()
            digest.update(f"|{jar.resolve()}:{info.st_size}:{info.st_mtime_ns}".encode())
        root = cache_root() / "jvm-archive"
        conf_dir = root / "conf"
        conf_dir.mkdir(parents=True, exist_ok=True)
        if any(conf_dir.iterdir()):
            logger.debug("%s is not empty: no JVM class archive", conf_dir)
            return None
    except OSError as exc:
        logger.debug("no JVM class archive: %s", exc)
        return None
    path = root / f"spark-{digest.hexdigest()[:16]}.jsa"
    if path.is_file():
        _mark_used(path)
        return JvmArchive(path, conf_dir, training=False)
    if not train:
        return None
    _remove_stale(root)
    return JvmArchive(path, conf_dir, training=True)


def _mark_used(path: Path) -> None:
    try:
        if path.stat().st_mtime < time.time() - _MARK_USED_SECONDS:
            os.utime(path)
    except OSError as exc:  # another user's cache: it is only kept for a while longer
        logger.debug("cannot mark %s used: %s", path, exc)


def _remove_stale(root: Path) -> None:
    """Before a training start: partial archives of training runs that were killed while their
    JVM wrote (hours old), archives no start has used for _UNUSED_SECONDS (another install's, or
    an upgraded one's), and the least recently used beyond MAX_ARCHIVES - 1."""
    now = time.time()
    used: list[tuple[float, Path]] = []
    for path in root.glob("spark-*.jsa*"):
        try:
            mtime = path.stat().st_mtime
        except OSError:
            continue
        if path.suffix == ".jsa":
            if mtime >= now - _UNUSED_SECONDS:
                used.append((mtime, path))
                continue
        elif ".jsa.tmp" not in path.name or mtime >= now - _STALE_SECONDS:
            continue  # not a partial archive, or one a training run may still be writing
        _unlink(path)
    for _, old in sorted(used, reverse=True)[MAX_ARCHIVES - 1 :]:
        _unlink(old)


def _unlink(path: Path) -> None:
    try:
        path.unlink()
        logger.debug("removed %s", path)
    except OSError:  # gone already, or another user's cache
        pass


def started(archive: JvmArchive) -> None:
    """Remember a training start: `finish_training` completes it."""
    global _training
    _training = archive if archive.training else None


def finish_training(spark: SparkSession) -> None:
    """After the first run with no archive: stop Spark and let its JVM exit normally, which is
    when it writes the archive, then move the archive into place for the next start. Costs that
    one run a few seconds more at exit; a run killed instead simply leaves no archive."""
    global _training
    archive, _training = _training, None
    if archive is None:
        return
    from pyspark import SparkContext

    gateway = SparkContext._gateway
    proc = getattr(gateway, "proc", None)
    spark.stop()
    if proc is None or proc.stdin is None:
        return
    logger.info("writing the JVM class archive %s for faster starts (once)", archive.path)
    try:
        proc.stdin.close()  # the JVM exits normally when its stdin closes
        proc.wait(_DUMP_SECONDS)
    except Exception as exc:  # noqa: BLE001 - an optimisation: the next run tries again
        logger.debug("the JVM did not exit to write its class archive: %s", exc)
        return
    partial = archive.partial
    if partial.is_file() and partial.stat().st_size > 0 and proc.returncode == 0:
        os.replace(partial, archive.path)
    else:
        partial.unlink(missing_ok=True)
