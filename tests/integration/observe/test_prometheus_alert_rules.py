"""The alert rules shipped in conf/prometheus-alerts.yml, loaded by Debian's real Prometheus tools:
`promtool check rules` accepts them, and `promtool test rules` (alerts_test.yml beside this file)
shows each alert firing on a job in trouble (query down, a stalled watermark while records wait,
lag growing, batches failing) and quiet on a healthy or idle one."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
RULES = ROOT / "conf" / "prometheus-alerts.yml"
RULE_TESTS = Path(__file__).resolve().parent / "prometheus" / "alerts_test.yml"


def _promtool() -> str:
    found = shutil.which("promtool")
    if found is None:
        if os.environ.get("CI") == "true":
            pytest.fail("promtool is missing under CI: .ci/run installs Debian's prometheus first")
        pytest.skip("promtool not installed (apt-get install prometheus): alert rules not checked")
    return found


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [_promtool(), *args], capture_output=True, text=True, timeout=120, check=False, cwd=ROOT
    )


def test_promtool_accepts_the_shipped_alert_rules() -> None:
    done = _run("check", "rules", str(RULES))
    assert done.returncode == 0, done.stdout + done.stderr
    assert "SUCCESS: 4 rules found" in done.stdout, done.stdout


def test_each_alert_fires_on_a_job_in_trouble_and_only_then() -> None:
    done = _run("test", "rules", str(RULE_TESTS))
    assert done.returncode == 0, done.stdout + done.stderr
    assert "SUCCESS" in done.stdout, done.stdout
    tested = RULE_TESTS.read_text(encoding="utf-8")
    for alert in ("IpcountQueryDown", "IpcountWatermarkStalled", "IpcountLagGrowing"):
        assert f"alertname: {alert}" in tested, f"alerts_test.yml does not exercise {alert}"
