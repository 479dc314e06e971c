"""A Spark home for the driver JVM that `ipcount run` launches, whose Python processes import
PySpark from the installed package (cached bytecode) instead of `pyspark.zip`."""

from __future__ import annotations

import hashlib
import logging
import os
import shutil
from pathlib import Path

from ipcount.hostpaths import cache_root

__all__ = ["launch_spark_home"]

logger = logging.getLogger(__name__)

# Jars the job never uses whose presence costs every start: spark-mllib registers a session
# extension (ServiceLoader, `InternalFunctionRegistration`) that builds Scala's runtime reflection
# universe for ML's functions: ~0.3 s of the session's creation, ~0.9 CPU-s of the JVM in all
# (its classes compiled too; measured over `compare.sh` 1M runs).
_LEFT_OUT_JARS = ("spark-mllib_",)
# The layout of the homes built here: a new one gets a new directory, never an old one reused.
_LAYOUT = 2


def _build(home: Path, target: Path) -> None:
    tmp = target.with_name(f"{target.name}.tmp{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    (tmp / "python" / "lib").mkdir(parents=True)
    for entry in home.iterdir():
        if entry.name not in ("python", "jars"):
            (tmp / entry.name).symlink_to(entry)
    (tmp / "jars").mkdir()
    for entry in (home / "jars").iterdir():
        if not entry.name.startswith(_LEFT_OUT_JARS):
            (tmp / "jars" / entry.name).symlink_to(entry)
    for entry in (home / "python" / "lib").iterdir():
        if entry.name != "pyspark.zip":
            (tmp / "python" / "lib" / entry.name).symlink_to(entry)
    try:
        tmp.rename(target)
    except OSError:
        shutil.rmtree(tmp, ignore_errors=True)  # another process built it first
        if not target.is_dir():
            raise


def launch_spark_home() -> Path | None:
    """The Spark home to launch the driver JVM with, or None to keep PySpark's own.

    Spark puts `pyspark.zip` first on the PYTHONPATH of every Python process it starts: the task
    workers' daemon and, on the driver, a fresh process for each Python data source step (create
    the source and the sink, plan the read, the write, the commits). Python cannot cache bytecode
    for modules imported from a zip, so each of those processes compiles PySpark anew: ~0.5 CPU-s
    each, one after another while a query starts. Measured with `ipcount bench scaling` (1M
    records, one run): S 19.7 -> 14.6 s, first batch 14.7 -> 10.0 s, Python CPU 13.4 -> 8.7 s.

    The Spark home built here is the pip-installed one (`pyspark/`, with bin/ and jars/) as links,
    minus that zip: the processes then import the very same PySpark from site-packages, with its
    cached bytecode. Its jars/ leaves out MLlib (_LEFT_OUT_JARS), which the job never uses and
    whose session extension costs every start. It applies only when PySpark is a pip install and
    nobody set SPARK_HOME; any problem building it leaves the zip in use (a debug log says why).
    """
    try:
        import pyspark

        home = Path(pyspark.__file__).resolve().parent
        if not (home / "python" / "lib" / "pyspark.zip").is_file() or not (home / "jars").is_dir():
            logger.debug("PySpark at %s is not a pip install: keeping its Spark home", home)
            return None
        tag = hashlib.sha256(str(home).encode()).hexdigest()[:12]
        target = cache_root() / f"spark-home-{pyspark.__version__}-{tag}-{_LAYOUT}"
        if not target.is_dir():
            _build(home, target)
        return target
    except OSError as exc:
        logger.debug("no link-built Spark home (%s): Python processes import pyspark.zip", exc)
        return None
