"""Apache Kafka's broker jars from Maven Central, fetched once into a cache (local tooling only):
by Maven if `mvn` is on the PATH, else PySpark's Ivy (env IPCOUNT_KAFKA_RESOLVER picks one);
env IPCOUNT_KAFKA_JARS names a directory of jars to use instead."""

from __future__ import annotations

import fcntl
import importlib.util
import logging
import os
import re
import shutil
import tempfile
import time
from pathlib import Path

from ipcount.childproc import spawn
from ipcount.errors import BrokerError
from ipcount.hostpaths import cache_root, find_java

__all__ = ["JARS_ENV", "KAFKA_VERSION", "RESOLVER_ENV", "java_executable", "kafka_classpath"]

logger = logging.getLogger(__name__)

KAFKA_VERSION = "4.4.0"
JARS_ENV = "IPCOUNT_KAFKA_JARS"
RESOLVER_ENV = "IPCOUNT_KAFKA_RESOLVER"
_RESOLVERS = ("auto", "maven", "ivy")
# Kafka 4.x logs through slf4j 1.7; this binding sends it to log4j2 (configured per broker).
_LOG4J_VERSION = "2.25.5"
_DEPENDENCY_PLUGIN = "org.apache.maven.plugins:maven-dependency-plugin:3.8.1"
_TIMEOUT_S = 900
_PROGRESS_EVERY_S = 15.0
_OFFLINE_HINT = f"or point {JARS_ENV} at a Kafka distribution's libs/ directory"

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

# Ivy's `default` configuration of a module read from a pom is Maven's runtime scope (compile and
# runtime dependencies, transitively, no optional, provided or test ones): what Maven copies below.
_IVY_MODULE = """<ivy-module version="2.0">
  <info organisation="ipcount" module="ipcount-local-kafka" revision="{version}"/>
  <configurations><conf name="default"/></configurations>
  <dependencies>
    <dependency org="org.apache.kafka" name="kafka_2.13" rev="{version}" conf="default->default"/>
    <dependency org="org.apache.logging.log4j" name="log4j-slf4j-impl" rev="{log4j}"
                conf="default->default"/>
  </dependencies>
</ivy-module>
"""

# Only Maven Central (the ibiblio resolver's default root), never ~/.ivy2; no lookups of the
# sources and javadoc jars nothing here uses (two requests per module saved).
_IVY_SETTINGS = """<ivysettings>
  <property name="ivy.maven.lookup.sources" value="false" override="true"/>
  <property name="ivy.maven.lookup.javadoc" value="false" override="true"/>
  <settings defaultResolver="central"/>
  <resolvers><ibiblio name="central" m2compatible="true"/></resolvers>
</ivysettings>
"""

_NETWORK = re.compile(
    r"UnknownHostException|ConnectException|SocketTimeoutException|NoRouteToHostException"
    r"|SSLHandshakeException|Connection refused|Connection timed out|Network is unreachable"
    r"|Temporary failure in name resolution|Unknown host|Could not transfer"
)
_NOT_FOUND = re.compile(
    r"kafka_2\.13;\S+: not found"
    r"|(Could not find artifact|Failure to find) org\.apache\.kafka:kafka_2"
)
_FAILED_ARTIFACT = re.compile(r"\[FAILED\s*\]\s*(\S+)")
_DOWNLOADED = re.compile(r"\[SUCCESSFUL \]|^Downloaded from ")


def java_executable() -> str:
    """`$JAVA_HOME/bin/java`, else `java` on PATH.

    Raises:
        BrokerError: no Java on this machine (the message says how to install it).
    """
    found = find_java()
    if found is None:
        raise BrokerError(
            "the Apache Kafka broker (broker.kind = 'kafka') needs Java 17 or newer and there is "
            "no java on the PATH: install it (Debian/Ubuntu: `apt-get install "
            "openjdk-17-jre-headless`) or set JAVA_HOME to a JDK/JRE; broker.kind = 'noida-db' "
            "needs nothing but pip"
        )
    return str(found)


def kafka_classpath(version: str = KAFKA_VERSION) -> str:
    """The broker's Java classpath (`dir/*`), fetching the jars from Maven Central on first use.

    One process fetches at a time (a file lock; the others wait and use its jars). The jars land
    in a staging directory renamed into place once complete, so a fetch that fails or is killed
    leaves no partial `libs/`.

    Raises:
        BrokerError: the jars are missing and cannot be fetched: no Java, Maven asked for but not
            installed, Maven Central unreachable, the version unknown there, or an incomplete
            download (the message names which and what to do).
    """
    override = os.environ.get(JARS_ENV)
    if override:
        libs = Path(override)
        if not any(libs.glob("kafka_2.13-*.jar")):
            raise BrokerError(f"{JARS_ENV}={override} holds no kafka_2.13-*.jar")
        return str(libs / "*")
    home = cache_root() / f"kafka-{version}"
    libs = home / "libs"
    marker = libs / f"kafka_2.13-{version}.jar"
    if marker.is_file():
        return str(libs / "*")
    resolver = _pick_resolver()
    home.mkdir(parents=True, exist_ok=True)
    with open(home / ".lock", "w") as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            logger.info(
                "another process is fetching the Kafka %s jars into %s: waiting", version, libs
            )
            fcntl.flock(lock, fcntl.LOCK_EX)
        if not marker.is_file():
            _fetch(resolver, version, home, libs)
    return str(libs / "*")


def _pick_resolver() -> str:
    """`maven` or `ivy`, from env IPCOUNT_KAFKA_RESOLVER (default auto: Maven if installed)."""
    choice = os.environ.get(RESOLVER_ENV, "auto").strip().lower() or "auto"
    if choice not in _RESOLVERS:
        raise BrokerError(
            f"{RESOLVER_ENV}={choice!r} is not a resolver for the Kafka jars: use one of "
            f"{', '.join(_RESOLVERS)}"
        )
    if choice == "maven" and shutil.which("mvn") is None:
        raise BrokerError(
            f"{RESOLVER_ENV}=maven but Maven (mvn) is not on the PATH: install Maven, or unset it "
            f"(or set {RESOLVER_ENV}=ivy) to fetch with the Ivy inside PySpark"
        )
    if choice == "auto":
        return "maven" if shutil.which("mvn") else "ivy"
    return choice


def _ivy_jar() -> Path:
    spec = importlib.util.find_spec("pyspark")
    if spec is not None and spec.origin is not None:
        found = sorted((Path(spec.origin).parent / "jars").glob("ivy-*.jar"))
        if found:
            return found[-1]
    raise BrokerError(
        "fetching the Kafka jars without Maven uses the Ivy jar inside PySpark "
        "(pyspark/jars/ivy-*.jar), and this Python has none: `pip install -e .` installs PySpark; "
        f"or install Maven, {_OFFLINE_HINT}"
    )


def _command(resolver: str, version: str, home: Path, staging: Path) -> tuple[list[str], str]:
    """The resolver's command line (files it reads written into `home`) and its name for people."""
    if resolver == "maven":
        pom = home / "pom.xml"
        pom.write_text(_POM.format(version=version, log4j=_LOG4J_VERSION), encoding="utf-8")
        cmd = [
            "mvn",
            "-B",
            "-f",
            str(pom),
            f"{_DEPENDENCY_PLUGIN}:copy-dependencies",
            f"-DoutputDirectory={staging}",
            "-DincludeScope=runtime",
        ]
        return cmd, "Maven (mvn)"
    module, settings = home / "ivy.xml", home / "ivysettings.xml"
    module.write_text(_IVY_MODULE.format(version=version, log4j=_LOG4J_VERSION), encoding="utf-8")
    settings.write_text(_IVY_SETTINGS, encoding="utf-8")
    ivy = _ivy_jar()
    cmd = [java_executable(), "-jar", str(ivy), "-settings", str(settings)]
    # The cache outlives a failed fetch, so the next try resumes; it is deleted after success.
    cmd += ["-cache", str(home / "ivy-cache"), "-ivy", str(module), "-confs", "default"]
    cmd += [
        "-types",
        "jar",
        "bundle",
        "-retrieve",
        f"{staging}/[artifact]-[revision](-[classifier]).[ext]",
    ]
    return cmd, f"Apache Ivy ({ivy.name} from PySpark)"


def _fetch(resolver: str, version: str, home: Path, libs: Path) -> None:
    java_executable()  # the broker needs it anyway; say so before anything is downloaded
    for dead in home.glob("libs.partial-*"):  # left by a fetch that was killed
        shutil.rmtree(dead, ignore_errors=True)
    staging = Path(tempfile.mkdtemp(prefix="libs.partial-", dir=home))
    try:
        cmd, tool = _command(resolver, version, home, staging)
        log_path = home / "fetch.log"
        logger.info(
            "fetching Apache Kafka %s jars from Maven Central with %s (once, into %s)",
            version,
            tool,
            libs,
        )
        started = time.monotonic()
        returncode = _run(cmd, log_path, version)
        output = log_path.read_text(encoding="utf-8", errors="replace")
        _check(tool, version, returncode, output, staging, log_path)
        shutil.rmtree(libs, ignore_errors=True)
        staging.rename(libs)
        shutil.rmtree(home / "ivy-cache", ignore_errors=True)
        jars = list(libs.glob("*.jar"))
        logger.info(
            "fetched %d jars (%.0f MiB) in %.0f s into %s",
            len(jars),
            sum(j.stat().st_size for j in jars) / 2**20,
            time.monotonic() - started,
            libs,
        )
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def _run(cmd: list[str], log_path: Path, version: str) -> int:
    """Run the resolver with its output in `log_path`, a progress line every 15 s."""
    started = time.monotonic()
    next_note = started + _PROGRESS_EVERY_S
    try:
        child = spawn(cmd, log=log_path, own_session=False, append=False)
    except OSError as exc:
        raise BrokerError(f"could not run {cmd[0]} to fetch the Kafka jars: {exc}") from exc
    try:
        while (returncode := child.poll()) is None:
            now = time.monotonic()
            if now - started > _TIMEOUT_S:
                raise BrokerError(
                    f"fetching the Apache Kafka {version} jars from Maven Central took over "
                    f"{_TIMEOUT_S // 60} minutes (output in {log_path}); run again to "
                    f"resume, {_OFFLINE_HINT}"
                )
            if now >= next_note:
                text = log_path.read_text(encoding="utf-8", errors="replace")
                count = sum(1 for line in text.splitlines() if _DOWNLOADED.search(line.strip()))
                logger.info("still fetching: %d files downloaded in %.0f s", count, now - started)
                next_note = now + _PROGRESS_EVERY_S
            time.sleep(0.2)
    finally:
        if child.alive:
            child.kill(wait=None)
    return returncode


def _check(
    tool: str, version: str, returncode: int, output: str, staging: Path, log_path: Path
) -> None:
    """Raise a BrokerError saying why, unless the resolver succeeded with the broker's jar."""
    complete = (staging / f"kafka_2.13-{version}.jar").is_file()
    failed = _FAILED_ARTIFACT.findall(output)
    if returncode == 0 and complete and not failed:
        return
    lines = output.splitlines()
    network = next((ln.strip() for ln in lines if _NETWORK.search(ln)), None)
    where = f"{tool} exit {returncode}; full output in {log_path}"
    if network is not None:
        raise BrokerError(
            f"could not reach Maven Central to fetch the Apache Kafka {version} jars ({where}): "
            f"{_clip(network)}\nCheck the network (behind a proxy: Maven's settings.xml, or "
            f"JAVA_TOOL_OPTIONS=-Dhttps.proxyHost=... for Ivy), {_OFFLINE_HINT}"
        )
    if any(_NOT_FOUND.search(ln) for ln in lines):
        raise BrokerError(
            f"Maven Central has no org.apache.kafka:kafka_2.13:{version} ({where}): set "
            "broker.kafka_version to a released Apache Kafka version"
        )
    if failed or returncode == 0:
        missing = ", ".join(failed) or f"kafka_2.13-{version}.jar"
        raise BrokerError(
            f"the download of the Apache Kafka {version} jars from Maven Central was incomplete "
            f"(missing {missing}; {where}); nothing was installed: run again to resume, "
            f"{_OFFLINE_HINT}"
        )
    tail = "\n".join(ln for ln in lines[-15:] if ln.strip())
    raise BrokerError(
        f"{tool} could not fetch Apache Kafka {version} from Maven Central ({where}): try the "
        f"other resolver ({RESOLVER_ENV}=maven or ivy), {_OFFLINE_HINT}:\n{tail}"
    )


def _clip(line: str, keep: int = 300) -> str:
    # Resolver error lines end with the cause ("... Connection refused"): keep the end.
    return line if len(line) <= keep else "..." + line[-keep:]
