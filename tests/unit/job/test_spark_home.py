"""The Spark home `ipcount run` launches its JVM with: the installed PySpark, minus pyspark.zip."""

from __future__ import annotations

from pathlib import Path

import pyspark
import pytest

from ipcount.job.spark_home import launch_spark_home


def test_it_is_pysparks_home_without_the_zip(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    home = launch_spark_home()
    assert home is not None and home.is_relative_to(tmp_path / "ipcount")
    real = Path(pyspark.__file__).resolve().parent
    assert (home / "bin" / "spark-submit").resolve() == real / "bin" / "spark-submit"
    # Every jar of PySpark's, as links, but MLlib's (the job never uses it; its session
    # extension costs every start).
    jars = sorted(p.name for p in (home / "jars").iterdir())
    assert jars == sorted(
        p.name for p in (real / "jars").iterdir() if not p.name.startswith("spark-mllib_")
    )
    assert "spark-sql_2.13-4.3.0.jar" in jars and "spark-mllib-local_2.13-4.3.0.jar" in jars
    assert all((home / "jars" / name).resolve() == real / "jars" / name for name in jars)
    assert not (home / "python" / "lib" / "pyspark.zip").exists()
    assert [p.name for p in (home / "python" / "lib").iterdir()] == [
        p.name for p in (real / "python" / "lib").iterdir() if p.name != "pyspark.zip"
    ]
    assert launch_spark_home() == home  # built once, then reused


def test_an_unwritable_cache_keeps_pysparks_own_home(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    blocked = tmp_path / "file"
    blocked.write_text("not a directory")
    monkeypatch.setenv("XDG_CACHE_HOME", str(blocked))
    assert launch_spark_home() is None
