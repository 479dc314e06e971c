"""Apache Kafka's broker jars from Maven Central, fetched once into a cache by Maven.

A small pom (Kafka's `kafka_2.13` artifact plus a log4j2 binding for its slf4j 1 logging) is
resolved by `mvn dependency:copy-dependencies` into `~/.cache/ipcount/kafka-<version>/libs`
($XDG_CACHE_HOME is honoured); env IPCOUNT_KAFKA_JARS names a directory of jars to use instead
(an offline machine, or a Kafka distribution's `libs/`).
"""

from __future__ import annotations

import fcntl
import logging
import os
import shutil
import subprocess
from pathlib import Path

from ipcount.errors import BrokerError

__all__ = ["KAFKA_VERSION", "kafka_classpath", "java_executable"]

logger = logging.getLogger(__name__)

KAFKA_VERSION = "4.4.0"
# Kafka 4.x logs through slf4j 1.7; this binding sends it to log4j2 (configured per broker).
_LOG4J_VERSION = "2.25.5"
_DEPENDENCY_PLUGIN = "org.apache.maven.plugins:maven-dependency-plugin:3.8.1"

_POM = """<project xmlns="http://maven.apache.org/POM/4.0.0">
  <modelVersion>4.0.0</modelVersion>
  <groupId>ipcount</groupId>
  <artifactId>ipcount-local-kafka</artifactId>
  <version>{version}</version>
  <packaging>pom</packaging>
  <dependencies>
    <dependency>
      <groupId>org.apache.kafka</groupId>
      <artifactId>kafka_2.13</artifactId>
      <version>{version}</version>
    </dependency>
    <dependency>
      <groupId>org.apache.logging.log4j</groupId>
      <artifactId>log4j-slf4j-impl</artifactId>
      <version>{log4j}</version>
    </dependency>
  </dependencies>
</project>
"""


def java_executable() -> str:
    """`$JAVA_HOME/bin/java`, else `java` on PATH.

    Raises:
        BrokerError: no Java on this machine.
    """
    home = os.environ.get("JAVA_HOME")
    if home and (Path(home) / "bin" / "java").is_file():
        return str(Path(home) / "bin" / "java")
    found = shutil.which("java")
    if found is None:
        raise BrokerError(
            "the Apache Kafka broker (broker.kind = 'kafka') needs Java 17 or newer: install a "
            "JDK (Debian: openjdk-17-jre-headless) or set JAVA_HOME; broker.kind = 'noida-db' "
            "needs nothing but pip"
        )
    return found


def _cache_root() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "ipcount"


def kafka_classpath(version: str = KAFKA_VERSION) -> str:
    """The broker's Java classpath (`dir/*`), fetching the jars on first use.

    Raises:
        BrokerError: the jars are missing and Maven is not installed or cannot reach Maven
            Central (the message says how to provide them instead).
    """
    override = os.environ.get("IPCOUNT_KAFKA_JARS")
    if override:
        libs = Path(override)
        if not any(libs.glob("kafka_2.13-*.jar")):
            raise BrokerError(f"IPCOUNT_KAFKA_JARS={override} holds no kafka_2.13-*.jar")
        return str(libs / "*")
    home = _cache_root() / f"kafka-{version}"
    libs = home / "libs"
    marker = libs / f"kafka_2.13-{version}.jar"
    if marker.is_file():
        return str(libs / "*")
    home.mkdir(parents=True, exist_ok=True)
    with open(home / ".lock", "w") as lock:  # one download at a time, across processes
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not marker.is_file():
            _download(version, home, libs)
    return str(libs / "*")


def _download(version: str, home: Path, libs: Path) -> None:
    mvn = shutil.which("mvn")
    if mvn is None:
        raise BrokerError(
            f"the Apache Kafka {version} jars are not in {libs} and Maven (mvn) is not installed "
            "to fetch them from Maven Central: install Maven, or point IPCOUNT_KAFKA_JARS at a "
            "Kafka distribution's libs/ directory"
        )
    pom = home / "pom.xml"
    pom.write_text(_POM.format(version=version, log4j=_LOG4J_VERSION), encoding="utf-8")
    staging = home / "libs.partial"
    shutil.rmtree(staging, ignore_errors=True)
    logger.info("fetching Apache Kafka %s jars from Maven Central into %s", version, libs)
    cmd = [
        mvn,
        "-q",
        "-B",
        "-f",
        str(pom),
        f"{_DEPENDENCY_PLUGIN}:copy-dependencies",
        f"-DoutputDirectory={staging}",
        "-DincludeScope=runtime",
    ]
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=900, check=False)
    except subprocess.TimeoutExpired:
        raise BrokerError(f"fetching the Kafka {version} jars took over 15 minutes") from None
    if done.returncode != 0 or not (staging / f"kafka_2.13-{version}.jar").is_file():
        tail = "\n".join((done.stdout + done.stderr).strip().splitlines()[-15:])
        raise BrokerError(
            f"Maven could not fetch Apache Kafka {version} from Maven Central "
            f"(exit {done.returncode}); run `{' '.join(cmd)}` to see why, or point "
            f"IPCOUNT_KAFKA_JARS at a Kafka distribution's libs/ directory:\n{tail}"
        )
    shutil.rmtree(libs, ignore_errors=True)
    staging.rename(libs)
