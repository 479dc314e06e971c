"""Which class-data-sharing archive the driver JVM gets: one per java binary, class path (the Spark
home's path and its jars) and JVM options; written only by a start that will let its JVM exit
normally (`ipcount run`)."""

from __future__ import annotations

import os
import shutil
import time
from pathlib import Path

import pytest

from ipcount.job.jvm_archive import plan_archive


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    jdk = tmp_path / "jdk" / "bin"
    jdk.mkdir(parents=True)
    (jdk / "java").write_bytes(b"a java")
    monkeypatch.setenv("JAVA_HOME", str(tmp_path / "jdk"))
    spark = tmp_path / "spark"
    (spark / "jars").mkdir(parents=True)
    for name in ("spark-core.jar", "spark-sql.jar"):
        (spark / "jars" / name).write_bytes(b"classes")
    return spark


def _trained(home: Path, options: str) -> Path:
    """The archive a start with `options` uses, written by that start if it trains one."""
    planned = plan_archive(home, options, train=True)
    assert planned is not None
    if planned.training:
        planned.path.write_bytes(b"archive")
    return planned.path


def test_only_a_training_start_writes_an_archive_the_next_starts_use(home: Path) -> None:
    assert plan_archive(home, "-XX:TieredStopAtLevel=1", train=False) is None
    first = plan_archive(home, "-XX:TieredStopAtLevel=1", train=True)
    assert first is not None and first.training
    opts = first.java_options(None)
    # The JVM writes a partial file of its own; the run moves it into place once it is whole.
    assert f"-XX:ArchiveClassesAtExit={first.partial}" in opts and first.partial != first.path
    assert "-Xlog:cds=off" in opts
    first.path.write_bytes(b"archive")
    again = plan_archive(home, "-XX:TieredStopAtLevel=1", train=True)
    assert again is not None and not again.training and again.path == first.path
    log4j = Path("/etc/ipcount/log4j2.properties")
    opts = again.java_options(log4j)
    assert f"-XX:SharedArchiveFile={first.path}" in opts
    assert f"-Dlog4j.configurationFile=file:{log4j}" in opts
    # Spark puts SPARK_CONF_DIR on the class path; the JVM archives no non-empty directory.
    assert again.conf_dir.is_dir() and not any(again.conf_dir.iterdir())


def test_another_jvm_jar_set_or_options_get_another_archive(home: Path) -> None:
    def path() -> Path:
        planned = plan_archive(home, options, train=True)
        assert planned is not None
        return planned.path

    options = "-XX:TieredStopAtLevel=1"
    base = path()
    (home / "jars" / "kafka-clients.jar").write_bytes(b"more classes")
    with_jar = path()
    options = "-XX:TieredStopAtLevel=1 -Xmx4g"
    with_options = path()
    java = Path(os.environ["JAVA_HOME"]) / "bin" / "java"
    java.write_bytes(b"another java, upgraded")
    with_java = path()
    assert len({base, with_jar, with_options, with_java}) == 4


def test_no_archive_when_its_conf_dir_holds_files_or_there_is_no_java(
    home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    planned = plan_archive(home, "", train=True)
    assert planned is not None
    (planned.conf_dir / "spark-env.sh").write_text("export X=1\n")
    assert plan_archive(home, "", train=True) is None
    (planned.conf_dir / "spark-env.sh").unlink()
    monkeypatch.setenv("JAVA_HOME", str(home / "nowhere"))
    monkeypatch.setenv("PATH", str(home / "nowhere"))
    assert plan_archive(home, "", train=True) is None


def test_a_training_start_removes_partial_archives_of_killed_runs(home: Path) -> None:
    planned = plan_archive(home, "", train=True)
    assert planned is not None
    old = planned.path.with_name(planned.path.name + ".tmp4242")
    fresh = planned.path.with_name(planned.path.name + ".tmp4343")
    old.write_bytes(b"half")
    fresh.write_bytes(b"being written")
    hours_ago = time.time() - 3 * 3600
    os.utime(old, (hours_ago, hours_ago))
    plan_archive(home, "", train=True)
    assert not old.exists() and fresh.exists()


def test_archives_no_start_has_used_for_long_are_removed_when_another_is_trained(
    home: Path,
) -> None:
    # Each install, upgrade or option change trains an archive of ~170 MB: those its starts no
    # longer use must not pile up in the cache (ten of them, 1.5 GB, after two days here).
    kept, used, old, older = (_trained(home, f"-Dn={n}") for n in range(4))
    long_ago = time.time() - 40 * 86400
    for path in (kept, used, old, older):
        os.utime(path, (long_ago, long_ago))
    assert _trained(home, "-Dn=1") == used  # a start that uses an archive marks it used
    assert used.stat().st_mtime > time.time() - 60
    fresh = _trained(home, "-Dn=new")  # a training start removes those unused for weeks
    assert fresh.exists() and used.exists()
    assert not kept.exists() and not old.exists() and not older.exists()


def test_the_cache_keeps_the_most_recently_used_archives_when_many_are_trained_at_once(
    home: Path,
) -> None:
    # Installs made within days (virtualenvs, test checkouts, upgrades) each train one: eleven in
    # one day here, 1.8 GB, all too recent for the two weeks' rule. A training start leaves the
    # cache at most MAX_ARCHIVES, the ones starts used last kept.
    from ipcount.job.jvm_archive import MAX_ARCHIVES

    def on_disk() -> set[Path]:
        return set(home.parent.glob("cache/ipcount/jvm-archive/spark-*.jsa"))

    now = time.time()
    made = []
    for n in range(MAX_ARCHIVES + 3):
        made.append(_trained(home, f"-Dn={n}"))
        hours_ago = now - 7200 * (MAX_ARCHIVES + 3 - n)  # trained and used in this order
        os.utime(made[-1], (hours_ago, hours_ago))
        assert len(on_disk()) <= MAX_ARCHIVES
    assert on_disk() == set(made[-MAX_ARCHIVES:])
    oldest = made[-MAX_ARCHIVES]
    assert (
        _trained(home, f"-Dn={len(made) - MAX_ARCHIVES}") == oldest
    )  # a start uses it: now the newest
    fresh = _trained(
        home, "-Dn=new"
    )  # so the next training removes the least recently used instead
    assert on_disk() == {oldest, *made[-MAX_ARCHIVES + 2 :], fresh}


def test_each_install_of_the_same_spark_gets_an_archive_of_its_own(home: Path) -> None:
    # A second virtualenv (or CI's .venv beside a user's) holds the same jars at another path: the
    # JVM ignores an archive made for another class path, so that install must train its own.
    other = home.parent / "other-venv" / "pyspark"
    shutil.copytree(home, other)
    first = plan_archive(home, "", train=True)
    assert first is not None and first.training
    first.path.write_bytes(b"archive of the first install")
    second = plan_archive(other, "", train=True)
    assert second is not None and second.training, "the second install found the first's archive"
    assert second.path != first.path and second.conf_dir == first.conf_dir
    assert plan_archive(other, "", train=False) is None  # nothing of its own to use yet
    second.path.write_bytes(b"archive of the second install")
    for install, archive in ((home, first), (other, second)):
        again = plan_archive(install, "", train=True)
        assert again is not None and not again.training and again.path == archive.path


def test_a_reinstall_at_the_same_path_trains_a_new_archive(home: Path) -> None:
    # Reinstalled jars have new modification times: the JVM would reject the old archive.
    first = plan_archive(home, "", train=True)
    assert first is not None
    first.path.write_bytes(b"archive")
    jar = home / "jars" / "spark-core.jar"
    later = jar.stat().st_mtime + 60
    os.utime(jar, (later, later))
    again = plan_archive(home, "", train=True)
    assert again is not None and again.training and again.path != first.path
