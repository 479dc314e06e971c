"""The class-data-sharing archive end to end with a real JVM: the first run of each install (a
Spark home with its own copies of the jars, like a second virtualenv) writes an archive for its
class path when its JVM exits, and the next starts of that install load Spark's classes from it."""

from __future__ import annotations

import json
import os
import shutil
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
# The JVM's class loading log says where each class came from; "(top)" is the dynamic archive.
_FROM_ARCHIVE = "source: shared objects file (top)"


def _start(mode: str, cache: Path, spark_home: Path | None = None) -> tuple[dict[str, str], int]:
    """One start of a Spark session as `ipcount run` makes it: its result, and how many classes
    the driver JVM loaded from the class archive."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SPARK_", "PYSPARK_"))}
    env["XDG_CACHE_HOME"] = str(cache)
    if spark_home is not None:
        env["SPARK_HOME"] = str(spark_home)
    log = cache / f"class-load-{mode}.log"
    log.unlink(missing_ok=True)
    env["JAVA_TOOL_OPTIONS"] = f"-Xlog:class+load=info:file={log}"
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
    shared = log.read_text(errors="replace").count(_FROM_ARCHIVE) if log.exists() else 0
    return result, shared


def _second_install(target: Path) -> Path:
    """A Spark home like a second `pip install pyspark`: the same jars, copied (new files, new
    modification times) to another path; the rest linked to the installed PySpark."""
    import pyspark

    home = Path(pyspark.__file__).resolve().parent
    target.mkdir(parents=True)
    for entry in home.iterdir():
        if entry.name != "jars":
            (target / entry.name).symlink_to(entry)
    (target / "jars").mkdir()
    for jar in (home / "jars").iterdir():
        if jar.is_dir():  # not on the class path (`jars/*` names the files)
            (target / "jars" / jar.name).symlink_to(jar)
        else:
            shutil.copyfile(jar, target / "jars" / jar.name)
    return target


def test_each_install_writes_its_archive_on_its_first_run_and_uses_it_next(tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    archive_dir = cache / "ipcount" / "jvm-archive"
    first, _ = _start("train", cache)
    assert first["groups"] == 3 and "-XX:ArchiveClassesAtExit=" in first["options"]
    archives = list(archive_dir.glob("spark-*.jsa"))
    assert len(archives) == 1 and archives[0].stat().st_size > 1_000_000
    assert not list(archive_dir.glob("*.tmp*"))  # moved into place whole
    second, shared = _start("use", cache)
    assert second["groups"] == 3
    assert f"-XX:SharedArchiveFile={archives[0]}" in second["options"]
    assert shared > 1000, "the JVM did not load Spark's classes from the archive"

    other = _second_install(tmp_path / "other-venv" / "pyspark")
    try:
        other_first, _ = _start("train", cache, other)
        assert other_first["groups"] == 3
        assert "-XX:ArchiveClassesAtExit=" in other_first["options"], (
            "the second install did not train an archive of its own"
        )
        mine = set(archive_dir.glob("spark-*.jsa")) - set(archives)
        assert len(mine) == 1
        other_next, other_shared = _start("use", cache, other)
        assert f"-XX:SharedArchiveFile={mine.pop()}" in other_next["options"]
        assert other_shared > 1000, "the second install's JVM loaded no class from its archive"
    finally:
        shutil.rmtree(other / "jars", ignore_errors=True)
