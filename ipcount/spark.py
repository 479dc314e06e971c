"""Build the SparkSession the job runs in (driver side): settings, state store, Python workers,
quiet logs."""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ipcount.config import Settings

__all__ = ["spark_conf", "build_session", "register_data_sources", "CONF_DIR"]

logger = logging.getLogger(__name__)

# conf/ beside the package in a source checkout (log4j2.properties, spark-defaults.conf).
CONF_DIR = Path(__file__).resolve().parent.parent / "conf"

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
        # Changelog checkpointing makes RocksDB commits cheap (only the batch's changes are
        # uploaded).
        "spark.sql.streaming.stateStore.rocksdb.changelogCheckpointing.enabled": "true",
        "spark.sql.session.timeZone": "UTC",
        "spark.sql.execution.arrow.pyspark.enabled": "true",
        # Reused Python workers keep one Kafka consumer per worker across micro-batches.
        "spark.python.worker.reuse": "true",
        "spark.driver.memory": s.driver_memory,
        "spark.ui.showConsoleProgress": "false",
    }
    conf.update(s.conf)
    return conf


def build_session(settings: Settings, extra: Mapping[str, str] | None = None) -> Any:
    """Get or create the SparkSession with ipcount's settings and its data sources registered.

    Args:
        settings: ipcount settings ([spark] section is used).
        extra: further Spark settings (tests, spark-submit overrides).
    """
    from pyspark.sql import SparkSession

    # Python workers must use this interpreter; unset, Spark runs the system python3, which lacks
    # ipcount and fails with a misleading "Python worker failed to connect back".
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    # Local mode stays on loopback unless the operator says otherwise.
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    # With IPCOUNT_FAULTS set, a fault point in a Python worker must kill the whole job (the
    # pyspark daemon runs workers in its own process group): pin the driver's group first.
    from ipcount.faults import pin_process_group

    pin_process_group()
    builder = SparkSession.builder.appName(settings.spark.app_name)
    # spark-submit sets the master itself; only set it when not launched that way.
    if "spark.master" not in _submit_conf():
        builder = builder.master(settings.spark.master)
    log4j = CONF_DIR / "log4j2.properties"
    if log4j.is_file():
        opt = f"-Dlog4j2.configurationFile=file:{log4j}"
        builder = builder.config("spark.driver.extraJavaOptions", opt)
        builder = builder.config("spark.executor.extraJavaOptions", opt)
    for key, value in {**spark_conf(settings), **(extra or {})}.items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel(os.environ.get("IPCOUNT_SPARK_LOG_LEVEL", "WARN"))
    register_data_sources(spark)
    return spark


def register_data_sources(spark: Any) -> None:
    """Register ipcount's Python data sources (the Kafka source and the transactional sink)."""
    import importlib

    for module_name, class_name in (
        ("ipcount.source", "KafkaDataSource"),
        ("ipcount.sink", "KafkaTxnDataSource"),
    ):
        try:
            module = importlib.import_module(module_name)
        except ModuleNotFoundError as exc:
            if exc.name != module_name:
                raise
            logger.debug("data source module %s not present", module_name)
            continue
        spark.dataSource.register(getattr(module, class_name))


def _submit_conf() -> dict[str, str]:
    # Under spark-submit, the launcher passes the master in PYSPARK_SUBMIT_ARGS / spark conf env.
    if os.environ.get("SPARK_ENV_LOADED") or os.environ.get("PYSPARK_GATEWAY_PORT"):
        return {"spark.master": "set-by-spark-submit"}
    return {}
