"""The class-data-sharing archive end to end with a real JVM: a training start writes it when its
JVM exits, the next start launches its JVM with it and runs Spark as before."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

_SCRIPT = """
import json, sys
from ipcount.config import load_settings
from ipcount.job.jvm_archive import finish_training
from ipcount.job.session import build_session

train = sys.argv[1] == "train"
spark = build_session(load_settings(None, env={}), train_archive=train)
rows = spark.range(100).selectExpr("id % 3 AS k").groupBy("k").count().collect()
options = spark.sparkContext.getConf().get("spark.driver.extraJavaOptions", "")
if train:
    finish_training(spark)
print(json.dumps({"groups": len(rows), "options": options}))
"""


def _start(mode: str, cache: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SPARK_", "PYSPARK_"))}
    env["XDG_CACHE_HOME"] = str(cache)
    done = subprocess.run(
        [sys.executable, "-c", _SCRIPT, mode],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    result: dict[str, str] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def test_the_first_run_writes_the_archive_the_next_uses_it(tmp_path: Path) -> None:
    first = _start("train", tmp_path)
    assert first["groups"] == 3 and "-XX:ArchiveClassesAtExit=" in first["options"]
    archives = list((tmp_path / "ipcount" / "jvm-archive").glob("spark-*.jsa"))
    assert len(archives) == 1 and archives[0].stat().st_size > 1_000_000
    assert not list(archives[0].parent.glob("*.tmp*"))  # moved into place whole
    second = _start("use", tmp_path)
    assert second["groups"] == 3
    assert f"-XX:SharedArchiveFile={archives[0]}" in second["options"]
