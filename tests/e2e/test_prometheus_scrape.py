"""Debian's real Prometheus scrapes a real `ipcount run --metrics-port` every second, with the
alert rules of conf/prometheus-alerts.yml loaded: its HTTP API returns the job's series (every
record counted once, one lag series per source partition, the query up) and every rule evaluates
against them without error."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from ipcount.kafka.topics import ensure_topics
from ipcount.local.broker import free_port

ROOT = Path(__file__).resolve().parents[2]
RULES = ROOT / "conf" / "prometheus-alerts.yml"

_CONFIG = """\
global:
  scrape_interval: 1s
  evaluation_interval: 1s
rule_files:
  - {rules}
scrape_configs:
  - job_name: ipcount
    static_configs:
      - targets: ["127.0.0.1:{target}"]
"""


def _prometheus() -> str:
    found = shutil.which("prometheus")
    if found is None:
        if os.environ.get("CI") == "true":
            pytest.fail(
                "prometheus is missing under CI: .ci/run installs Debian's prometheus first"
            )
        pytest.skip("prometheus not installed (apt-get install prometheus): no real scrape")
    return found


class Prometheus:
    """A Prometheus of this test's own: its config, data and port, stopped by its PID."""

    def __init__(self, workdir: Path, target: int) -> None:
        workdir.mkdir(parents=True)
        config = workdir / "prometheus.yml"
        config.write_text(_CONFIG.format(rules=RULES, target=target))
        self.port = free_port()
        self.log = workdir / "prometheus.log"
        self.proc = subprocess.Popen(
            [
                _prometheus(),
                f"--config.file={config}",
                f"--storage.tsdb.path={workdir / 'data'}",
                f"--web.listen-address=127.0.0.1:{self.port}",
            ],
            cwd=workdir,
            stdout=subprocess.DEVNULL,
            stderr=self.log.open("w"),
        )

    def api(self, path: str, **params: str) -> Any:
        """The `data` of a Prometheus API answer, or None while it does not answer yet."""
        query = f"?{urllib.parse.urlencode(params)}" if params else ""
        url = f"http://127.0.0.1:{self.port}/api/v1/{path}{query}"
        try:
            with urllib.request.urlopen(url, timeout=5) as resp:  # noqa: S310 - our own server
                answer = json.load(resp)
        except OSError:
            return None
        assert answer["status"] == "success", answer
        return answer["data"]

    def samples(self, expr: str) -> dict[str, float]:
        """The instant vector `expr` as {labels as JSON: value}."""
        data = self.api("query", query=expr)
        if not data:
            return {}
        return {
            json.dumps(r["metric"], sort_keys=True): float(r["value"][1]) for r in data["result"]
        }

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(30)


def _wait(what: str, cond: Callable[[], Any], procs: dict[str, Any], logs: list[Path]) -> Any:
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        got = cond()
        if got:
            return got
        for name, proc in procs.items():
            if proc.poll() is not None:
                raise AssertionError(f"{name} exited ({proc.returncode}) while waiting for {what}")
        time.sleep(0.5)
    tails = "\n".join(f"== {log.name}\n{log.read_text()[-3000:]}" for log in logs)
    raise AssertionError(f"timed out waiting for {what}\n{tails}")


@pytest.fixture
def job_and_prometheus(  # type: ignore[no-untyped-def]
    make_settings, tmp_path, Feed, ipcount_env
) -> Iterator[tuple[Any, Prometheus, int, int]]:
    settings = make_settings()
    ensure_topics(settings)
    feed = Feed(settings)
    feed.round(0, 10)  # 500 records, waiting before the job starts
    port = free_port()
    log = tmp_path / "job.log"
    job = subprocess.Popen(
        [sys.executable, "-m", "ipcount", "run", "--metrics-port", str(port)],
        env=ipcount_env(settings, {"IPCOUNT_METRICS_LAG_POLL_SECONDS": "1"}),
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
        stderr=log.open("w"),
    )
    prometheus = None
    try:
        prometheus = Prometheus(tmp_path / "prometheus", port)
        yield job, prometheus, port, settings.topics.source_partitions
    finally:
        if prometheus is not None:
            prometheus.stop()
        if job.poll() is None:
            job.send_signal(signal.SIGTERM)
            job.wait(120)
    assert job.returncode == 0, log.read_text()[-4000:]


def test_prometheus_scrapes_the_running_job_and_evaluates_the_alert_rules(
    job_and_prometheus: tuple[Any, Prometheus, int, int], tmp_path: Path
) -> None:
    job, prometheus, port, partitions = job_and_prometheus
    procs = {"the job": job, "prometheus": prometheus.proc}
    logs = [tmp_path / "job.log", prometheus.log]
    target = {"instance": f"127.0.0.1:{port}", "job": "ipcount"}
    counted = json.dumps({"__name__": "ipcount_records_total", **target}, sort_keys=True)

    # Every record counted once, as Prometheus stored it from the job's own endpoint.
    records = _wait(
        "ipcount_records_total = 500 in Prometheus",
        lambda: (lambda s: s if s.get(counted) == 500 else None)(
            prometheus.samples("ipcount_records_total")
        ),
        procs,
        logs,
    )
    assert records == {counted: 500}
    assert prometheus.samples('up{job="ipcount"}') == {
        json.dumps({"__name__": "up", **target}, sort_keys=True): 1
    }
    # One lag series per source partition, all caught up; the query up.
    lags = _wait(
        "a lag of 0 on every partition",
        lambda: (lambda s: s if len(s) == partitions and not any(s.values()) else None)(
            prometheus.samples("ipcount_source_lag_records")
        ),
        procs,
        logs,
    )
    assert all(json.loads(k)["job"] == "ipcount" for k in lags)
    assert list(prometheus.samples('ipcount_query_up{job="ipcount"}').values()) == [1]
    # The batch's transaction committed (counted once its commit is acknowledged).
    _wait(
        "a committed transaction in Prometheus",
        lambda: any(
            v >= 1
            for v in prometheus.samples(
                'ipcount_transactions_committed_total{query="ipcount"}'
            ).values()
        ),
        procs,
        logs,
    )

    # The shipped rules, loaded from conf/, evaluated against these series: all healthy, none
    # firing on a healthy job.
    def evaluated() -> list[dict[str, Any]] | None:
        data = prometheus.api("rules")
        rules = [r for g in (data or {}).get("groups", []) for r in g["rules"]]
        done = rules and all(not r["lastEvaluation"].startswith("0001-") for r in rules)
        return rules if done else None

    rules = _wait("the alert rules evaluated", evaluated, procs, logs)
    assert sorted(r["name"] for r in rules) == [
        "IpcountBatchesFailing",
        "IpcountLagGrowing",
        "IpcountQueryDown",
        "IpcountWatermarkStalled",
    ]
    assert all(r["health"] == "ok" for r in rules), rules
    assert all(r["state"] == "inactive" for r in rules), rules
