"""Static checks of the Dockerfile, .dockerignore and conf/docker-entrypoint.sh (Docker cannot run here):
what the image copies exists and is not ignored, Java 17, non-root, the same spark-submit entry
point as docs/deployment.md, settings env that ipcount accepts."""

from __future__ import annotations

import fnmatch
import os
import re
import shlex
import subprocess
import tomllib
from pathlib import Path

import pytest

from ipcount.config import load_settings

ROOT = Path(__file__).resolve().parents[2]
ENTRYPOINT = ROOT / "conf" / "docker-entrypoint.sh"
# The job's entry file, its --config option and the `run` command: the docs and image must agree.
SUBMIT_APP = re.compile(r"(\S*ipcount/__main__\.py)\S*\s+--config\s+(\S+)\s+run\b")


def _instructions() -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) with continuation lines joined and comments dropped."""
    out: list[tuple[str, str]] = []
    pending = ""
    for raw in (ROOT / "Dockerfile").read_text().splitlines():
        line = raw.strip()
        if not pending and (not line or line.startswith("#")):
            continue
        if line.startswith("#"):
            continue
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        full = (pending + line).strip()
        pending = ""
        word, _, rest = full.partition(" ")
        out.append((word.upper(), rest.strip()))
    assert not pending, "Dockerfile ends inside a continued line"
    return out


def _args(name: str) -> list[str]:
    return [rest for word, rest in _instructions() if word == name]


def _env() -> dict[str, str]:
    env: dict[str, str] = {}
    for rest in _args("ENV"):
        for item in shlex.split(rest):
            key, _, value = item.partition("=")
            env[key] = value
    return env


def _ignored(path: str) -> bool:
    patterns = [
        p.strip()
        for p in (ROOT / ".dockerignore").read_text().splitlines()
        if p.strip() and not p.startswith("#")
    ]
    parts = Path(path).parts
    prefixes = ["/".join(parts[: i + 1]) for i in range(len(parts))]
    return any(
        fnmatch.fnmatch(prefix, pat.removeprefix("**/")) or fnmatch.fnmatch(prefix, pat)
        for pat in patterns
        for prefix in prefixes
    )


def test_base_image_and_java_17() -> None:
    (base,) = _args("FROM")
    # python:3.11-slim, on the Debian release that still packages openjdk-17.
    assert re.fullmatch(r"python:3\.11-slim-bookworm", base), base
    (apt,) = [r for r in _args("RUN") if "openjdk-17-jre-headless" in r.split()]
    assert "--no-install-recommends" in apt
    assert "rm -rf /var/lib/apt/lists/*" in apt
    # The interpreter version in SPARK_HOME / PYSPARK_PYTHON paths matches the base image.
    assert "/python3.11/" in _env()["SPARK_HOME"]


def test_copied_files_exist_and_are_not_ignored() -> None:
    copies = _args("COPY")
    assert copies
    for rest in copies:
        *sources, _dest = shlex.split(rest)
        for src in sources:
            assert (ROOT / src).exists(), src
            assert not _ignored(src), f"{src} is excluded by .dockerignore"
    for heavy in (".venv", ".git", ".ipcount", "tests", "ipcount/__pycache__"):
        assert _ignored(heavy), heavy
    # pip builds the package from what was copied: pyproject's readme and packages are there.
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    copied = {shlex.split(r)[0] for r in copies} | {s for r in copies for s in shlex.split(r)[:-1]}
    assert project["readme"] in copied
    assert {"ipcount", "loadgen", "conf", "pyproject.toml"} <= copied


def test_package_installed_into_the_venv_the_env_points_at() -> None:
    env = _env()
    (install,) = [r for r in _args("RUN") if "pip install" in r]
    assert "python -m venv /opt/venv" in install
    # The job's dependencies plus the [loadgen] extra: the image also runs `loadgen serve`.
    assert "/opt/venv/bin/pip install '/opt/ipcount[loadgen]'" in install
    # The compiled helpers are built (setup.py is copied, gcc is there for pip) and checked.
    assert "setup.py" in _args("COPY")[0].split()
    assert "install -y --no-install-recommends gcc libc6-dev" in install
    assert "import ipcount.source._fastread, ipcount.formats._prefix_scan" in install
    assert env["PYSPARK_PYTHON"] == "/opt/venv/bin/python"
    assert env["PATH"].startswith("/opt/venv/bin:")
    assert env["SPARK_HOME"] == "/opt/venv/lib/python3.11/site-packages/pyspark"
    # conf/ (spark-defaults.conf, log4j2.properties) is the Spark conf dir, as the docs say.
    assert env["SPARK_CONF_DIR"] == "/opt/ipcount/conf"
    assert "COPY conf ./conf" in [f"COPY {r}" for r in _args("COPY")]
    for name in ("spark-defaults.conf", "log4j2.properties", "ipcount.toml"):
        assert (ROOT / "conf" / name).is_file(), name
    assert env["IPCOUNT_CONFIG"] == "/etc/ipcount/ipcount.toml"
    assert "conf/ipcount.toml /etc/ipcount/ipcount.toml" in _args("COPY")


def test_runs_as_non_root_user() -> None:
    users = _args("USER")
    assert users and users[-1] not in ("root", "0", "0:0"), users
    order = [word for word, _ in _instructions()]
    assert order.index("USER") < order.index("ENTRYPOINT")
    assert any("useradd" in r and users[-1] in r.split() for r in _args("RUN"))


def test_ports_and_entrypoint() -> None:
    exposed = {int(p) for rest in _args("EXPOSE") for p in rest.split()}
    # Spark UI, driver and block manager ports for a cluster's executors, `loadgen serve`.
    assert {4040, 7078, 7079, 8080} <= exposed
    serve_help = subprocess.run(
        [os.fspath(ROOT / ".venv" / "bin" / "loadgen"), "serve", "--help"],
        capture_output=True,
        text=True,
        timeout=60,
    ).stdout
    assert "default 8080" in serve_help
    (entry,) = _args("ENTRYPOINT")
    assert entry == '["/usr/bin/tini", "--", "/opt/ipcount/conf/docker-entrypoint.sh"]'
    assert "tini" in next(r for r in _args("RUN") if "apt-get install" in r).split()
    assert "conf ./conf" in _args("COPY")  # the entry point is conf/docker-entrypoint.sh
    assert _args("CMD") == ['["job"]']


def test_entrypoint_script_is_valid_and_submits_like_the_docs() -> None:
    assert os.access(ENTRYPOINT, os.X_OK)
    subprocess.run(["bash", "-n", str(ENTRYPOINT)], check=True, timeout=30)
    script = ENTRYPOINT.read_text()
    ours = SUBMIT_APP.findall(script)
    assert ours == [('"$APP_DIR/ipcount/__main__.py', '"$IPCOUNT_CONFIG"')], ours
    assert re.search(r"spark-submit --master \"\$SPARK_MASTER_URL\"", script)
    guide = (ROOT / "docs" / "deployment.md").read_text()
    documented = [
        m for block in re.findall(r"spark-submit[^`]*", guide) for m in SUBMIT_APP.findall(block)
    ]
    assert documented, "docs/deployment.md documents no spark-submit of ipcount/__main__.py ... run"
    for app, _config in documented:
        assert app.endswith("ipcount/__main__.py"), app


@pytest.mark.parametrize(
    ("args", "expect"),
    [
        (["ipcount", "--version"], "ipcount 0."),
        (["loadgen", "synth", "--help"], "usage: loadgen synth"),
        (["echo", "anything else"], "anything else"),
    ],
)
def test_entrypoint_subcommands(args: list[str], expect: str) -> None:
    env = {**os.environ, "PATH": f"{ROOT / '.venv' / 'bin'}{os.pathsep}{os.environ['PATH']}"}
    done = subprocess.run(
        [str(ENTRYPOINT), *args], env=env, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    assert expect in done.stdout


def test_image_env_is_accepted_by_ipcount_settings() -> None:
    # IPCOUNT_* names are settings: anything else with that prefix would stop every command.
    env = {k: v for k, v in _env().items() if k.startswith("IPCOUNT_")}
    assert set(env) == {"IPCOUNT_CONFIG", "IPCOUNT_METRICS_PORT", "IPCOUNT_METRICS_HOST"}
    script_vars = set(re.findall(r"\$\{?(IPCOUNT_[A-Z_]+)", ENTRYPOINT.read_text()))
    assert script_vars == {"IPCOUNT_CONFIG"}, script_vars
    settings = load_settings(ROOT / "conf" / "ipcount.toml", env=env)
    assert (settings.metrics.host, settings.metrics.port) == ("0.0.0.0", 9464)
    exposed = {int(p) for rest in _args("EXPOSE") for p in rest.split()}
    assert settings.metrics.port in exposed


HEALTHCHECK = ROOT / "conf" / "docker-healthcheck.sh"


def test_healthcheck_probes_the_jobs_healthz(tmp_path: Path) -> None:
    """The image's HEALTHCHECK against a real /healthz: 0 while it says 200, 1 on 503; a
    container that does not run the job is healthy."""
    from ipcount.observe.endpoint import MetricsServer
    from ipcount.observe.metrics import JobMetrics

    (check,) = _args("HEALTHCHECK")
    assert check.endswith('CMD ["/opt/ipcount/conf/docker-healthcheck.sh"]'), check
    assert "--start-period=" in check
    assert os.access(HEALTHCHECK, os.X_OK)
    metrics = JobMetrics()
    server = MetricsServer(metrics, "127.0.0.1", 0).start()
    marker = tmp_path / "job"

    def probe() -> subprocess.CompletedProcess[str]:
        env = {
            **os.environ,
            "IPCOUNT_METRICS_HOST": "127.0.0.1",
            "IPCOUNT_METRICS_PORT": str(server.port),
            "JOB_MARKER": str(marker),
            "PYTHON": str(ROOT / ".venv" / "bin" / "python"),
        }
        return subprocess.run(
            [str(HEALTHCHECK)], env=env, capture_output=True, text=True, timeout=30
        )

    try:
        done = probe()
        assert done.returncode == 0 and "not the job" in done.stdout
        marker.write_text("1\n")
        done = probe()
        assert done.returncode == 1 and "starting" in done.stdout, done
        metrics.started()
        done = probe()
        assert done.returncode == 0 and done.stdout.startswith("ok"), done
        metrics.failed("TransactionAbortedError: aborted", restart_delay=None)
        done = probe()
        assert done.returncode == 1 and "query failed" in done.stdout, done
    finally:
        server.stop()
    done = probe()
    assert done.returncode == 1 and "no answer" in done.stdout, done


@pytest.mark.parametrize(
    "host",
    [
        "127.0.0.2",  # one interface (any of 127/8 is loopback on Linux): probed there
        "0.0.0.0",  # every interface: probed on 127.0.0.1
        pytest.param("::", marks=pytest.mark.ipv6),
        pytest.param("::1", marks=pytest.mark.ipv6),
    ],
)
def test_healthcheck_probes_the_metrics_host(host: str, tmp_path: Path) -> None:
    from ipcount.observe.endpoint import MetricsServer
    from ipcount.observe.metrics import JobMetrics

    metrics = JobMetrics()
    metrics.started()
    server = MetricsServer(metrics, host, 0).start()
    (tmp_path / "job").write_text("1\n")
    env = {
        **os.environ,
        "IPCOUNT_METRICS_HOST": host,
        "IPCOUNT_METRICS_PORT": str(server.port),
        "JOB_MARKER": str(tmp_path / "job"),
        "PYTHON": str(ROOT / ".venv" / "bin" / "python"),
    }
    try:
        done = subprocess.run(
            [str(HEALTHCHECK)], env=env, capture_output=True, text=True, timeout=30
        )
    finally:
        server.stop()
    assert done.returncode == 0 and done.stdout.startswith("ok"), done
