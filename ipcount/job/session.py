"""Build the job's SparkSession (driver side): settings, state store, Python workers, quiet logs."""

from __future__ import annotations

import atexit
import logging
import os
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING

from ipcount.checkpoint.offset_log import local_path
from ipcount.config import Settings

__all__ = [
    "CONF_DIR",
    "DEFAULTS_FILE",
    "LAUNCH_ONLY",
    "LOCAL_CHECKPOINT_FILE_MANAGER",
    "JVM_OPTIONS",
    "spark_conf",
    "conf_dir",
    "read_spark_defaults",
    "launched_by_spark_submit",
    "session_conf",
    "build_session",
    "register_data_sources",
]

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

logger = logging.getLogger(__name__)

# conf/ beside the package in a source checkout: a Spark conf dir (spark-defaults.conf,
# log4j2.properties) that also holds ipcount.toml.
CONF_DIR = Path(__file__).resolve().parents[2] / "conf"
DEFAULTS_FILE = "spark-defaults.conf"
# Read when the driver JVM is launched: a JVM that spark-submit already started ignores them.
LAUNCH_ONLY = frozenset(
    {
        "spark.master",
        "spark.submit.deployMode",
        "spark.driver.memory",
        "spark.driver.cores",
        "spark.driver.extraJavaOptions",
        "spark.driver.extraClassPath",
        "spark.driver.extraLibraryPath",
    }
)

# The driver JVM's options (spark.driver.extraJavaOptions); add to them, do not drop them, when
# setting that key yourself.
JVM_OPTIONS = "-XX:TieredStopAtLevel=1"

# The checkpoint file manager of a local checkpoint (see spark_conf).
LOCAL_CHECKPOINT_FILE_MANAGER = (
    "org.apache.spark.sql.execution.streaming.checkpointing.FileSystemBasedCheckpointFileManager"
)

# What a launched JVM uses for a LAUNCH_ONLY setting nobody set.
_LAUNCH_DEFAULTS = {"spark.driver.memory": "1g"}

_STATE_STORE_PROVIDERS = {
    "rocksdb": "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider",
    "hdfs": "org.apache.spark.sql.execution.streaming.state.HDFSBackedStateStoreProvider",
}


def spark_conf(settings: Settings) -> dict[str, str]:
    """The Spark settings ipcount sets, from [spark]; [spark.conf] entries win."""
    s = settings.spark
    conf = {
        "spark.sql.shuffle.partitions": str(s.shuffle_partitions),
        "spark.sql.streaming.stateStore.providerClass": _STATE_STORE_PROVIDERS[s.state_store],
        # Changelog checkpointing makes RocksDB commits cheap (only a batch's changes are uploaded).
        "spark.sql.streaming.stateStore.rocksdb.changelogCheckpointing.enabled": "true",
        "spark.sql.session.timeZone": "UTC",
        "spark.sql.execution.arrow.pyspark.enabled": "true",
        # Reused Python workers: no fork and no imports per task (each read task opens its own
        # Kafka consumer; measured ~3 ms against a local broker, not worth pooling).
        "spark.python.worker.reuse": "true",
        "spark.driver.memory": s.driver_memory,
        # C1 only: the JVM no longer parses lines (the read tasks combine them), so C2's
        # optimisations buy nothing and its compiles cost ~10 CPU-s per start (measured with
        # `ipcount bench scaling`: JVM CPU 23.1 -> 13.7 s per 1M records, S 20.4 -> 18.3 s).
        "spark.driver.extraJavaOptions": JVM_OPTIONS,
        "spark.ui.showConsoleProgress": "false",
        # Local checkpoints keep Hadoop's checksummed file systems (and their .crc side files),
        # for FileContext and FileSystem alike. Raw variants were tried for speed (~20-35 ms less
        # per batch) and both broke the state store in long runs (issue #37): a raw FileSystem
        # `file` fails every RocksDB snapshot upload (copyFromLocalFile casts it to
        # LocalFileSystem), and a raw FileContext deletes purged SST files without the .crc that
        # the snapshot upload wrote beside them: a 2-hour soak left ~290 orphaned .crc files per
        # state partition, growing without bound. See _check_snapshot_file_system.
    }
    if local_path(settings.job.checkpoint_location) is not None:
        # Spark's default checkpoint file manager renames through Hadoop's FileContext, which on
        # the local file system forks `readlink` twice per rename (RawLocalFileSystem's link
        # check): ~20 processes per micro-batch on the driver's critical path, ~3 ms each, and
        # more in the state store's tasks. The FileSystem API renames with one rename(2); both
        # check "destination exists" before renaming, so neither is more atomic on a local disk.
        # Other schemes (hdfs://, s3a://) keep Spark's choice.
        conf["spark.sql.streaming.checkpointFileManagerClass"] = LOCAL_CHECKPOINT_FILE_MANAGER
    conf.update(s.conf)
    return conf


def conf_dir() -> Path | None:
    """The Spark conf dir whose spark-defaults.conf applies: $SPARK_CONF_DIR when it has one,
    else conf/ of this source checkout; None when neither exists (e.g. a plain wheel install)."""
    for candidate in (os.environ.get("SPARK_CONF_DIR"), CONF_DIR):
        if candidate and (Path(candidate) / DEFAULTS_FILE).is_file():
            return Path(candidate)
    return None


def read_spark_defaults(path: str | Path) -> dict[str, str]:
    """Parse a spark-defaults.conf: `key value` or `key=value` lines, `#`/`!` comments."""
    conf: dict[str, str] = {}
    for raw in Path(path).read_text(encoding="utf-8").splitlines():
        line = raw.strip()
        if not line or line[0] in "#!":
            continue
        cut = min((i for i, ch in enumerate(line) if ch in " \t=:"), default=len(line))
        key, rest = line[:cut], line[cut:].lstrip(" \t")
        if rest[:1] in ("=", ":"):
            rest = rest[1:].lstrip(" \t")
        conf[key] = rest
    return conf


def launched_by_spark_submit() -> bool:
    """True when this process is a spark-submit Python driver: its JVM already runs.

    spark-submit's PythonRunner hands the driver the gateway of the JVM it started in
    PYSPARK_GATEWAY_PORT; a process that launches its own JVM (`ipcount run`) has none yet.
    (SPARK_ENV_LOADED is no sign of it: any child of a Spark script inherits that.)
    """
    return "PYSPARK_GATEWAY_PORT" in os.environ


def session_conf(
    settings: Settings,
    extra: Mapping[str, str] | None = None,
    launched: Mapping[str, str] | None = None,
) -> dict[str, str]:
    """The settings build_session passes to the session builder.

    Lowest precedence first: the Spark conf dir's spark-defaults.conf (conf/ of this checkout, or
    $SPARK_CONF_DIR), then spark-submit's own flags, then ipcount's [spark] settings, then
    [spark.conf], then `extra`.

    Args:
        settings: ipcount settings ([spark] and [spark.conf]).
        extra: further settings that win over everything (tests, benchmarks).
        launched: the conf of a JVM spark-submit already started (None: ipcount launches it).
            spark-submit's values win over spark-defaults.conf, and settings only the launcher
            reads (LAUNCH_ONLY) are left out: they cannot change any more.
    """
    found = conf_dir()
    defaults = read_spark_defaults(found / DEFAULTS_FILE) if found else {}
    conf = {k: v for k, v in defaults.items() if launched is None or k not in launched}
    conf.update(spark_conf(settings))
    conf.update(extra or {})
    _check_snapshot_file_system(conf)
    if launched is None:
        return conf
    for key in sorted(LAUNCH_ONLY & conf.keys()):
        value = conf.pop(key)
        actual = launched.get(key, _LAUNCH_DEFAULTS.get(key, "unset"))
        if actual != value:
            logger.warning(
                "%s=%s does not apply: spark-submit started the driver with %s; "
                "set it with spark-submit (e.g. --driver-memory) or in %s",
                key,
                value,
                actual,
                DEFAULTS_FILE,
            )
    missing = [k for k in defaults if k not in launched and k not in LAUNCH_ONLY]
    if found is not None and missing:
        logger.info(
            "spark-submit did not load %s (run it with SPARK_CONF_DIR=%s): applying its "
            "session settings now (%s)",
            found / DEFAULTS_FILE,
            found,
            ", ".join(missing),
        )
    return conf


def _check_snapshot_file_system(conf: Mapping[str, str]) -> None:
    """Refuse raw local file systems under the RocksDB state store.

    RocksDBFileManager uploads a snapshot's files with FileSystem.copyFromLocalFile, which casts
    the `file` file system to LocalFileSystem: with RawLocalFileSystem every snapshot fails, Spark
    only logs it, the changelog grows forever and a bounded run fails its commit. It deletes
    purged files through Spark's checkpoint file manager (FileContext): with RawLocalFs the .crc
    that the upload wrote beside each SST file stays behind, one more file for every purged SST,
    forever (issue #37).

    Raises:
        ConfigError: spark.hadoop.fs.file.impl is RawLocalFileSystem, or
            spark.hadoop.fs.AbstractFileSystem.file.impl is RawLocalFs, with the RocksDB store.
    """
    provider = conf.get("spark.sql.streaming.stateStore.providerClass", "")
    if not provider.endswith("RocksDBStateStoreProvider"):
        return
    for key, raw, why in (
        ("spark.hadoop.fs.file.impl", "RawLocalFileSystem", "snapshot uploads fail"),
        (
            "spark.hadoop.fs.AbstractFileSystem.file.impl",
            "RawLocalFs",
            "purged snapshot files leave their .crc files behind, without bound",
        ),
    ):
        impl = conf.get(key, "")
        if impl.endswith(raw):
            from ipcount.errors import ConfigError

            raise ConfigError(
                f"{key} = {impl} breaks RocksDB's state snapshots ({why}): remove it from "
                "[spark.conf] or spark-defaults.conf; the state store needs Hadoop's checksummed "
                "local file systems"
            )


def _launched_conf() -> dict[str, str]:
    # The JVM spark-submit started holds its conf (flags, properties file) as system properties.
    from pyspark import SparkConf, SparkContext

    SparkContext._ensure_initialized()
    return dict(SparkConf().getAll())


def _use_archive(conf: dict[str, str], found: Path | None, train: bool) -> None:
    """Launch the JVM with its class-data-sharing archive (job.jvm_archive), or `train` it."""
    from ipcount.job.jvm_archive import plan_archive, started

    home = os.environ.get("SPARK_HOME")
    key = "spark.driver.extraJavaOptions"
    archive = plan_archive(Path(home), conf.get(key, ""), train=train) if home else None
    if archive is None:
        return
    log4j = found / "log4j2.properties" if found is not None else None
    options = archive.java_options(log4j if log4j is not None and log4j.is_file() else None)
    os.environ["SPARK_CONF_DIR"] = str(archive.conf_dir)
    conf[key] = f"{conf.get(key, '')} {options}".strip()
    started(archive)


def _use_job_temp_dir(conf: dict[str, str], settings: Settings) -> None:
    """Launch the JVM with the job's own temp dir as java.io.tmpdir (and so Spark's default
    spark.local.dir), emptied of a killed predecessor's files (ipcount.job.temp_dir). Not set:
    a java.io.tmpdir of the user's own, or a path with a space (the launcher splits options)."""
    from ipcount.job.temp_dir import claim_temp_dir, job_temp_dir

    key = "spark.driver.extraJavaOptions"
    options = conf.get(key, "")
    directory = job_temp_dir(settings.job.checkpoint_location)
    if "-Djava.io.tmpdir=" in options or " " in str(directory):
        return
    try:
        # Held by another live driver of this checkpoint (a zombie being fenced): the directory
        # is not ours to use, since whoever holds it next would empty it under us.
        if not claim_temp_dir(directory):
            return
    except OSError as exc:
        logger.warning("Spark's scratch files stay in the system temp dir: %s: %s", directory, exc)
        return
    conf[key] = f"{options} -Djava.io.tmpdir={directory}".strip()


def build_session(
    settings: Settings, extra: Mapping[str, str] | None = None, *, train_archive: bool = False
) -> SparkSession:
    """Get or create the SparkSession with ipcount's settings and its data sources registered.

    Under spark-submit the master and the driver JVM's settings come from spark-submit; otherwise
    ipcount launches the JVM with spark.master from [spark] and conf_dir() as SPARK_CONF_DIR
    (so the JVM also reads its log4j2.properties).

    Args:
        settings: ipcount settings ([spark] section is used).
        extra: further Spark settings (tests, benchmarks); they win over everything.
        train_archive: with spark.jvm_class_archive on and no archive yet, this JVM writes one
            when it exits; the caller ends it with jvm_archive.finish_training (`ipcount run`).
    """
    from pyspark.sql import SparkSession

    # Python workers must use this interpreter; unset, Spark runs the system python3, which lacks
    # ipcount and fails with a misleading "Python worker failed to connect back". Executors run
    # the same path: install the same environment at the same path on every node.
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    # With IPCOUNT_FAULTS set, a fault point in a Python worker must kill the whole job (the
    # pyspark daemon runs workers in its own process group): pin the driver's group first.
    from ipcount.faults import pin_process_group

    pin_process_group()
    builder = SparkSession.builder.appName(settings.spark.app_name)
    launched = _launched_conf() if launched_by_spark_submit() else None
    found, chosen_conf_dir = None, True
    if launched is None:
        master = settings.spark.master
        builder = builder.master(master)
        # Local mode stays on loopback; a cluster's executors must reach the driver, so the
        # operator chooses its address (SPARK_LOCAL_IP / spark.driver.host).
        if master.startswith("local"):
            os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
        found = conf_dir()
        chosen_conf_dir = "SPARK_CONF_DIR" in os.environ
        if found is not None:
            os.environ.setdefault("SPARK_CONF_DIR", str(found))
        if "SPARK_HOME" not in os.environ:
            from ipcount.job.spark_home import launch_spark_home

            home = launch_spark_home()
            if home is not None:
                os.environ["SPARK_HOME"] = str(home)
    else:
        if launched.get("spark.master") != settings.spark.master:
            logger.info(
                "master %s (from spark-submit; the spark.master setting %s is not used)",
                launched.get("spark.master"),
                settings.spark.master,
            )
        _check_py_files(launched)
    conf = session_conf(settings, extra, launched)
    if launched is None and settings.spark.jvm_class_archive and not chosen_conf_dir:
        _use_archive(conf, found, train_archive)
    if launched is None:
        _use_job_temp_dir(conf, settings)
    for key, value in conf.items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    if launched is not None:
        # This Python process ends before spark-submit's JVM: stop the session first, or the JVM's
        # listener bus calls the progress listener back into a Python that is gone (an ERROR).
        atexit.register(spark.stop)
    spark.sparkContext.setLogLevel(os.environ.get("IPCOUNT_SPARK_LOG_LEVEL", "WARN"))
    register_data_sources(spark)
    return spark


def _check_py_files(launched: Mapping[str, str]) -> None:
    """Warn when --py-files archives are not on spark-submit's PYTHONPATH as well.

    PySpark 4.3 gives --py-files to the driver's Python process and to executors, but not to the
    processes the driver JVM starts for a Python streaming data source (offsets, planning): they
    fail with "No module named 'ipcount'" unless the JVM's own PYTHONPATH names the archive.
    """
    from pyspark import SparkContext

    archives = [a for a in launched.get("spark.submit.pyFiles", "").split(",") if a]
    if not archives or SparkContext._jvm is None:
        return
    jvm_path = SparkContext._jvm.java.lang.System.getenv("PYTHONPATH") or ""
    on_path = {os.path.basename(p) for p in jvm_path.split(os.pathsep) if p}
    missing = [a for a in archives if os.path.basename(a) not in on_path]
    if missing:
        logger.warning(
            "--py-files %s: also put the archive on spark-submit's PYTHONPATH "
            "(PYTHONPATH=/absolute/path/ipcount.zip spark-submit ...), or the driver's Python data "
            "source processes cannot import ipcount",
            ",".join(missing),
        )


# ipcount's Python data sources, by module and class: the Kafka source, the transactional sink,
# and the start's warm-up. Spark's planner processes import these modules to create them.
DATA_SOURCES = (
    ("ipcount.source.data_source", "KafkaDataSource"),
    ("ipcount.sink.data_source", "KafkaTxnDataSource"),
    ("ipcount.job.warmup", "WarmupDataSource"),
)


def register_data_sources(spark: SparkSession) -> None:
    """Register ipcount's Python data sources (the Kafka source and the transactional sink)."""
    import importlib

    for module_name, class_name in DATA_SOURCES:
        try:
            module = importlib.import_module(module_name)
        except ModuleNotFoundError as exc:
            if exc.name != module_name:
                raise
            logger.debug("data source module %s not present", module_name)
            continue
        spark.dataSource.register(getattr(module, class_name))
