"""Spark settings: conf/spark-defaults.conf parsing, agreement with ipcount's settings, precedence
with and without spark-submit, and the spark-submit entry file run as a script."""

from __future__ import annotations

import logging
import subprocess
import sys
from pathlib import Path

import pytest

from ipcount.config import Settings, load_settings
from ipcount.errors import ConfigError
from ipcount.job.session import (
    CONF_DIR,
    DEFAULTS_FILE,
    LAUNCH_ONLY,
    LOCAL_CHECKPOINT_FILE_MANAGER,
    conf_dir,
    launched_by_spark_submit,
    read_spark_defaults,
    session_conf,
    spark_conf,
)

ROOT = Path(__file__).resolve().parents[3]


def _settings(*overrides: str):  # type: ignore[no-untyped-def]
    return load_settings(ROOT / "conf" / "ipcount.toml", env={}, overrides=list(overrides))


def test_read_spark_defaults_formats(tmp_path: Path) -> None:
    f = tmp_path / "spark-defaults.conf"
    f.write_text(
        "# comment\n! also a comment\n\n"
        "spark.a   1\n"
        "spark.b=2\n"
        "spark.c = x y  \n"
        "spark.d:4\n"
        "\tspark.e\t-Dk=v -Dk2=v2\n"
        "spark.empty\n"
    )
    assert read_spark_defaults(f) == {
        "spark.a": "1",
        "spark.b": "2",
        "spark.c": "x y",
        "spark.d": "4",
        "spark.e": "-Dk=v -Dk2=v2",
        "spark.empty": "",
    }


def test_spark_defaults_agrees_with_ipcount_settings() -> None:
    defaults = read_spark_defaults(CONF_DIR / DEFAULTS_FILE)
    ours = spark_conf(_settings())
    shared = sorted(defaults.keys() & ours.keys())
    # The job's essentials are in the file, with the values ipcount sets from conf/ipcount.toml.
    for key in (
        "spark.sql.shuffle.partitions",
        "spark.sql.streaming.stateStore.providerClass",
        "spark.sql.streaming.stateStore.rocksdb.changelogCheckpointing.enabled",
        "spark.sql.session.timeZone",
        "spark.sql.execution.arrow.pyspark.enabled",
        "spark.python.worker.reuse",
        "spark.driver.memory",
    ):
        assert key in shared, key
    assert {k: defaults[k] for k in shared} == {k: ours[k] for k in shared}
    # Never the master or the driver's address: those belong to spark-submit or [spark].
    assert not {"spark.master", "spark.driver.host", "spark.driver.port"} & defaults.keys()


def test_conf_dir_prefers_spark_conf_dir_with_a_defaults_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("SPARK_CONF_DIR", raising=False)
    assert conf_dir() == CONF_DIR
    # spark-submit's scripts set SPARK_CONF_DIR to $SPARK_HOME/conf even when it has no file.
    monkeypatch.setenv("SPARK_CONF_DIR", str(tmp_path))
    assert conf_dir() == CONF_DIR
    (tmp_path / DEFAULTS_FILE).write_text("spark.sql.shuffle.partitions 16\n")
    assert conf_dir() == tmp_path


def test_launched_by_spark_submit_means_a_gateway_was_handed_over(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("PYSPARK_GATEWAY_PORT", raising=False)
    monkeypatch.setenv("SPARK_ENV_LOADED", "1")  # inherited from any Spark script: not a sign
    assert not launched_by_spark_submit()
    monkeypatch.setenv("PYSPARK_GATEWAY_PORT", "40000")
    assert launched_by_spark_submit()


def test_precedence_when_ipcount_launches_the_jvm(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / DEFAULTS_FILE).write_text(
        "spark.sql.shuffle.partitions 64\nspark.speculation false\nspark.executor.memory 3g\n"
        "spark.driver.memory 8g\n"
    )
    monkeypatch.setenv("SPARK_CONF_DIR", str(tmp_path))
    conf = session_conf(
        _settings("spark.shuffle_partitions=6", "spark.conf.spark.executor.memory=5g"),
        {"spark.speculation": "true"},
    )
    assert conf["spark.sql.shuffle.partitions"] == "6"  # [spark] beats the file
    assert conf["spark.executor.memory"] == "5g"  # [spark.conf] beats the file
    assert conf["spark.speculation"] == "true"  # extra beats everything
    assert conf["spark.driver.memory"] == "2g"  # launched by ipcount: applies


def test_precedence_under_spark_submit(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    (tmp_path / DEFAULTS_FILE).write_text(
        "spark.speculation false\nspark.executor.memory 3g\nspark.python.worker.reuse true\n"
    )
    monkeypatch.setenv("SPARK_CONF_DIR", str(tmp_path))
    launched = {
        "spark.master": "spark://127.0.0.1:7077",
        "spark.executor.memory": "1g",  # spark-submit --conf: wins over the file
        "spark.sql.shuffle.partitions": "200",  # ... but not over ipcount's own settings
        "spark.driver.memory": "1g",
    }
    with caplog.at_level(logging.INFO, logger="ipcount.job.session"):
        conf = session_conf(_settings(), None, launched)
    assert "spark.executor.memory" not in conf  # the JVM already has spark-submit's value
    assert conf["spark.speculation"] == "false"  # missing from the JVM: applied from the file
    assert conf["spark.sql.shuffle.partitions"] == str(Settings().spark.shuffle_partitions)
    assert not LAUNCH_ONLY & conf.keys()  # a running JVM cannot take them
    messages = "\n".join(r.getMessage() for r in caplog.records)
    assert "spark.driver.memory=2g does not apply" in messages
    assert f"SPARK_CONF_DIR={tmp_path}" in messages


def test_no_driver_memory_warning_when_spark_submit_loaded_the_conf_dir(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setenv("SPARK_CONF_DIR", str(CONF_DIR))
    launched = {"spark.master": "local[2]", **read_spark_defaults(CONF_DIR / DEFAULTS_FILE)}
    with caplog.at_level(logging.INFO, logger="ipcount.job.session"):
        session_conf(_settings(), None, launched)
    assert not [r for r in caplog.records if r.levelno >= logging.INFO], caplog.records


def test_entry_file_runs_as_a_script_without_shadowing_stdlib(tmp_path: Path) -> None:
    # spark-submit runs ipcount/__main__.py as a script: ipcount/logsetup.py must not shadow logging.
    done = subprocess.run(
        [sys.executable, str(ROOT / "ipcount" / "__main__.py"), "--version"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("ipcount ")


def test_log4j_loggers_name_classes_that_exist() -> None:
    # Spark moves classes between packages (4.x moved streaming into .runtime/.checkpointing): a
    # stale logger name silently stops quieting anything.
    import zipfile

    from ipcount.local.cluster import spark_home

    classes: set[str] = set()
    for jar in (spark_home() / "jars").glob("*.jar"):
        if jar.name.startswith(("spark-", "hadoop-client")):
            with zipfile.ZipFile(jar) as z:
                classes.update(
                    n[: -len(".class")].replace("/", ".")
                    for n in z.namelist()
                    if n.endswith(".class")
                )
    names = [
        line.split("=", 1)[1].strip()
        for line in (CONF_DIR / "log4j2.properties").read_text().splitlines()
        if line.startswith("logger.") and ".name" in line.split("=", 1)[0]
    ]
    assert names
    missing = [n for n in names if n not in classes]
    assert not missing, missing


def test_a_raw_local_file_system_for_rocksdb_is_refused_with_the_reason() -> None:
    """fs.file.impl = RawLocalFileSystem makes every RocksDB snapshot upload fail (a cast to
    LocalFileSystem): the changelog grows forever and a bounded run fails near batch 50."""
    raw = "org.apache.hadoop.fs.RawLocalFileSystem"
    settings = load_settings(
        None,
        env={},
        overrides=[f"spark.conf.spark.hadoop.fs.file.impl={raw}"],
        use_default_path=False,
    )
    with pytest.raises(ConfigError, match=r"spark.hadoop.fs.file.impl.*snapshot"):
        session_conf(settings)
    # A raw FileContext leaves the .crc of every purged SST file behind (a 2-hour soak: ~290 per
    # state partition, growing).
    raw_fc = "org.apache.hadoop.fs.local.RawLocalFs"
    leaky = load_settings(
        None,
        env={},
        overrides=[f"spark.conf.spark.hadoop.fs.AbstractFileSystem.file.impl={raw_fc}"],
        use_default_path=False,
    )
    with pytest.raises(ConfigError, match=r"AbstractFileSystem.file.impl.*\.crc"):
        session_conf(leaky)
    assert "spark.hadoop.fs.AbstractFileSystem.file.impl" not in session_conf(_settings())
    # The HDFS-backed store does not copy files that way: allowed there.
    hdfs = load_settings(
        None,
        env={},
        overrides=[f"spark.conf.spark.hadoop.fs.file.impl={raw}", "spark.state_store=hdfs"],
        use_default_path=False,
    )
    assert session_conf(hdfs)["spark.hadoop.fs.file.impl"] == raw


def test_a_local_checkpoint_is_written_through_the_file_system_api() -> None:
    """Hadoop's FileContext forks `readlink` for every rename on a local disk; ipcount switches
    Spark's checkpoint file manager for local checkpoints only (HDFS keeps FileContext's atomic
    rename), and a user's own [spark.conf] choice wins."""
    key = "spark.sql.streaming.checkpointFileManagerClass"
    for local in ("/var/lib/ipcount/checkpoint", "file:///var/lib/ipcount/checkpoint", "ckpt"):
        conf = spark_conf(_settings(f"job.checkpoint_location={local}"))
        assert conf[key] == LOCAL_CHECKPOINT_FILE_MANAGER, local
    for remote in ("hdfs://nn:8020/ipcount/checkpoint", "s3a://bucket/ipcount/checkpoint"):
        assert key not in spark_conf(_settings(f"job.checkpoint_location={remote}")), remote
    mine = "com.example.MyCheckpointFileManager"
    assert spark_conf(_settings(f"spark.conf.{key}={mine}"))[key] == mine
