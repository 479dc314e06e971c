"""`pip install ipcount` (no extras) is enough for the job, `ipcount consume` and the metrics
endpoint: nothing they import needs the [loadgen] or [bench] extras, and every third-party package
ipcount imports is a core dependency."""

from __future__ import annotations

import ast
import re
import subprocess
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
EXTRAS_ONLY = ("aiohttp", "locust", "psutil")
# Import name -> distribution name, where they differ.
_DISTRIBUTION = {"confluent_kafka": "confluent-kafka", "prometheus_client": "prometheus_client"}

_WITHOUT_EXTRAS = f"""
import importlib.abc, sys

class Block(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in {EXTRAS_ONLY!r}:
            raise ModuleNotFoundError(f"No module named {{name!r}} (extras not installed)")
        return None

sys.meta_path.insert(0, Block())

from ipcount.cli import build_parser
args = build_parser().parse_args(["run", "--metrics-port", "9464"])
assert args.metrics_port == 9464
build_parser().parse_args(["consume", "--from-beginning"])
import ipcount.job.supervisor, ipcount.job.pipeline, ipcount.job.session, ipcount.observe.endpoint
import ipcount.source.reader, ipcount.sink.writer, ipcount.kafka.topic_reader, ipcount.verify.compare

import urllib.request
from ipcount.observe.endpoint import MetricsServer
from ipcount.observe.metrics import JobMetrics
server = MetricsServer(JobMetrics(), "127.0.0.1", 0).start()
with urllib.request.urlopen(f"http://127.0.0.1:{{server.port}}/metrics", timeout=5) as resp:
    assert b"ipcount_records_total 0.0" in resp.read()
server.stop()
print("ok")
"""


def test_the_job_runs_without_the_extras() -> None:
    done = subprocess.run(
        [sys.executable, "-c", _WITHOUT_EXTRAS],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr[-3000:]


def _core_dependencies() -> set[str]:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    return {re.split(r"[<>=!~\[ ;]", dep, maxsplit=1)[0].lower() for dep in project["dependencies"]}


def test_every_package_ipcount_imports_is_a_core_dependency() -> None:
    core = _core_dependencies()
    missing = set()
    for path in sorted((ROOT / "ipcount").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                names = [node.module]
            else:
                continue
            for name in names:
                top = name.split(".")[0]
                if top in sys.stdlib_module_names or top in ("ipcount", "loadgen"):
                    continue
                dist = _DISTRIBUTION.get(top, top).lower()
                if dist not in core and dist.replace("_", "-") not in core:
                    missing.add(f"{path.relative_to(ROOT)} imports {name}")
    # The local broker package is a development convenience (ipcount broker, tests), optional.
    missing = {m for m in missing if not m.endswith(("imports noida_db",))}
    # `ipcount bench` samples processes with psutil: the [bench] extra, required when it runs.
    missing = {m for m in missing if not re.match(r"ipcount/bench/\S+ imports psutil$", m)}
    assert not missing, "not in [project] dependencies:\n" + "\n".join(sorted(missing))
