"""The exactly-once path (ipcount/sink, ipcount/source) is type-checked as `mypy --strict` would,
from pyproject.toml's settings: a developer's `.venv/bin/mypy` and this test see the same."""

from __future__ import annotations

import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
STRICT_PACKAGES = {"ipcount.sink.*", "ipcount.source.*"}
# mypy --strict's per-module flags (mypy --help lists them under --strict).
STRICT_FLAGS = {
    "disallow_any_generics",
    "disallow_subclassing_any",
    "disallow_untyped_calls",
    "disallow_untyped_defs",
    "disallow_incomplete_defs",
    "check_untyped_defs",
    "disallow_untyped_decorators",
    "warn_return_any",
    "warn_unused_ignores",
    "no_implicit_reexport",
    "strict_equality",
    "extra_checks",
}


def test_the_sink_and_the_source_are_configured_strict() -> None:
    mypy = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["tool"]["mypy"]
    strict = [o for o in mypy.get("overrides", []) if STRICT_PACKAGES <= set(o.get("module", []))]
    assert strict, "pyproject.toml: no [[tool.mypy.overrides]] for ipcount.sink.* and .source.*"
    missing = {flag for flag in STRICT_FLAGS if strict[0].get(flag) is not True}
    assert not missing, f"strict flags not set for the sink and the source: {sorted(missing)}"


@pytest.mark.slow
def test_the_sink_and_the_source_pass_mypy_strict() -> None:
    # The packages' own errors only: a module they import is checked by its own owners' run.
    run = subprocess.run(
        [sys.executable, "-m", "mypy", "ipcount/sink", "ipcount/source"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
    )
    ours = [
        line
        for line in run.stdout.splitlines()
        if line.startswith(("ipcount/sink/", "ipcount/source/")) and ": error:" in line
    ]
    assert not ours, "\n".join(ours)
    assert run.returncode in (0, 1) and "error: " not in run.stderr, run.stderr
