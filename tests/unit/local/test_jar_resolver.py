"""What a user sees before any jar is fetched: a missing Java says how to install it, a bad
resolver switch names the variable, a complete cache is used as it is (no network here)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from ipcount.config import load_settings
from ipcount.errors import BrokerError
from ipcount.local.kafka_jars import KAFKA_VERSION, java_executable, kafka_classpath

JAVA = shutil.which("java")


@pytest.fixture
def bare_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    """An empty cache, no JAVA_HOME, no override, and a PATH with nothing on it."""
    empty = tmp_path / "empty-bin"
    empty.mkdir()
    monkeypatch.setenv("PATH", str(empty))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    for name in ("JAVA_HOME", "IPCOUNT_KAFKA_JARS", "IPCOUNT_KAFKA_RESOLVER"):
        monkeypatch.delenv(name, raising=False)
    return tmp_path


def _java_only_path(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    # A machine with Java but without Maven: a PATH holding only a link to this machine's java.
    if JAVA is None:
        pytest.skip("needs Java on the PATH")
    bin_dir = tmp_path / "java-bin"
    bin_dir.mkdir()
    (bin_dir / "java").symlink_to(JAVA)
    monkeypatch.setenv("PATH", str(bin_dir))


def test_no_java_says_how_to_install_it(bare_env: Path) -> None:
    with pytest.raises(BrokerError) as err:
        java_executable()
    message = str(err.value)
    assert "apt-get install openjdk-17-jre-headless" in message
    assert "JAVA_HOME" in message


def test_first_start_without_java_names_java_not_maven(bare_env: Path) -> None:
    with pytest.raises(BrokerError) as err:
        kafka_classpath()
    message = str(err.value)
    assert "apt-get install openjdk-17-jre-headless" in message
    assert "Maven (mvn)" not in message
    assert not (bare_env / "cache" / "ipcount" / f"kafka-{KAFKA_VERSION}" / "libs").exists()


@pytest.mark.parametrize(
    ("resolver", "said"),
    [
        # An unknown resolver: the variable and its values.
        ("gradle", ["IPCOUNT_KAFKA_RESOLVER='gradle'", "auto, maven, ivy"]),
        # Maven asked for but not installed: says so, and names the way without it.
        ("maven", ["IPCOUNT_KAFKA_RESOLVER=maven", "mvn", "IPCOUNT_KAFKA_RESOLVER=ivy"]),
    ],
)
def test_a_resolver_that_cannot_run_is_named_with_what_to_do(
    bare_env: Path, monkeypatch: pytest.MonkeyPatch, resolver: str, said: list[str]
) -> None:
    _java_only_path(monkeypatch, bare_env)
    monkeypatch.setenv("IPCOUNT_KAFKA_RESOLVER", resolver)
    with pytest.raises(BrokerError) as err:
        kafka_classpath()
    message = str(err.value)
    for words in said:
        assert words in message, message


def test_a_complete_cache_is_used_without_java_maven_or_network(bare_env: Path) -> None:
    libs = bare_env / "cache" / "ipcount" / f"kafka-{KAFKA_VERSION}" / "libs"
    libs.mkdir(parents=True)
    (libs / f"kafka_2.13-{KAFKA_VERSION}.jar").write_bytes(b"PK")
    assert kafka_classpath() == str(libs / "*")


def test_override_without_kafka_jar_names_the_variable(
    bare_env: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("IPCOUNT_KAFKA_JARS", str(bare_env))
    with pytest.raises(BrokerError, match="IPCOUNT_KAFKA_JARS=.* holds no kafka_2.13-"):
        kafka_classpath()


def test_the_jar_variables_are_not_taken_for_kafka_settings() -> None:
    # IPCOUNT_KAFKA_* is also the prefix of the [kafka] settings' env overrides.
    root = Path(__file__).resolve().parents[3]
    env = {"IPCOUNT_KAFKA_JARS": "/opt/kafka/libs", "IPCOUNT_KAFKA_RESOLVER": "ivy"}
    settings = load_settings(root / "conf" / "ipcount.toml", env=env)
    assert settings.kafka.bootstrap_servers
