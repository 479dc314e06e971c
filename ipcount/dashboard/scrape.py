"""The pipeline's health for the dashboard, read from the job's Prometheus metrics endpoint:
source lag, watermark delay, batch time, records, late and malformed counts. CLI side."""

from __future__ import annotations

import http.client
import logging
import math
import time
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import asdict, dataclass
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from ipcount.errors import ConfigError
from ipcount.queries import COUNTS_QUERY

__all__ = ["Health", "MetricsPoller", "parse_metrics", "check_metrics_url"]

logger = logging.getLogger(__name__)

# Sample name in the job's exposition -> our field. The lag gauge has one sample per
# (topic, partition): they are summed.
_SAMPLES = {
    "ipcount_source_lag_records": "lag_records",
    "ipcount_watermark_delay_seconds": "watermark_delay_seconds",
    "ipcount_batch_duration_seconds_sum": "batch_seconds_sum",
    "ipcount_batch_duration_seconds_count": "batches",
    "ipcount_records_total": "records_total",
    "ipcount_late_records_total": "late_total",
    "ipcount_malformed_records_total": "malformed_total",
    "ipcount_query_up": "up",
    "ipcount_input_records_per_second": "input_rate",
}
_MAX_BODY = 4 * 1024 * 1024
# Batch times of queries other than the counting query (the dead-letter query's) are not the job's.
_PER_QUERY = ("ipcount_batch_duration_seconds_sum", "ipcount_batch_duration_seconds_count")


def check_metrics_url(url: str) -> str:
    """The URL if it is http(s)://host[:port]/...

    Raises:
        ConfigError: naming --metrics-url.
    """
    parts = urllib.parse.urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise ConfigError(
            f"--metrics-url must be an http(s) URL such as http://127.0.0.1:9464/metrics, "
            f"got {url!r}"
        )
    return url


def parse_metrics(text: str) -> dict[str, float | None]:
    """The job's figures from a Prometheus text exposition (None: not in it).

    Raises:
        ValueError: the text is not a Prometheus exposition.
    """
    values: dict[str, float | None] = dict.fromkeys(_SAMPLES.values())
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            key = _SAMPLES.get(sample.name)
            query = sample.labels.get("query", COUNTS_QUERY)
            if sample.name in _PER_QUERY and query != COUNTS_QUERY:
                continue
            value = float(sample.value)
            # NaN (e.g. the watermark delay before the first watermark) means "not known yet".
            if key is not None and math.isfinite(value):
                values[key] = (values[key] or 0.0) + value
    return values


@dataclass(frozen=True)
class Health:
    """What the health panel shows. status: 'none' (no endpoint given), 'ok', 'unreachable' or
    'invalid' (it answered, but not with the job's metrics); `message` says it in words."""

    status: str
    message: str
    url: str | None = None
    up: bool | None = None
    lag_records: float | None = None
    watermark_delay_seconds: float | None = None
    # Mean batch time of the batches since the previous read (the mean of all before the first).
    batch_seconds: float | None = None
    batches: int | None = None
    records_total: float | None = None
    late_total: float | None = None
    malformed_total: float | None = None
    records_per_second: float | None = None

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


class MetricsPoller:
    """Reads the endpoint on demand; remembers the previous read for rates."""

    def __init__(self, url: str | None, timeout: float = 1.0) -> None:
        self.url = check_metrics_url(url) if url else None
        self.timeout = timeout
        self._prev: tuple[float, dict[str, float | None]] | None = None

    def _fetch(self) -> str:
        assert self.url is not None  # noqa: S101 - read() checks
        req = urllib.request.Request(self.url, headers={"Accept": "text/plain"})  # noqa: S310
        # The scheme was checked to be http(s) in __init__.
        with urllib.request.urlopen(req, timeout=self.timeout) as resp:  # noqa: S310
            return str(resp.read(_MAX_BODY).decode("utf-8", "replace"))

    def read(self) -> Health:
        """The current health (never raises: failures are a status)."""
        if self.url is None:
            return Health(
                "none",
                "no metrics endpoint given: start the dashboard with --metrics-url "
                "http://HOST:PORT/metrics (the job's Prometheus endpoint) to see lag, watermark "
                "delay and batch times",
            )
        try:
            text = self._fetch()
        except (OSError, urllib.error.URLError) as exc:
            reason = getattr(exc, "reason", exc)
            return Health(
                "unreachable", f"metrics endpoint {self.url} unreachable: {reason}", self.url
            )
        except http.client.HTTPException as exc:
            # It answered, but not in HTTP (e.g. an SSH server's "SSH-2.0-..." banner).
            return Health(
                "invalid",
                f"{self.url} did not answer in HTTP ({type(exc).__name__}: {exc}): is it the "
                "job's metrics endpoint?",
                self.url,
            )
        except ValueError as exc:  # e.g. a header line longer than http.client allows
            return Health("invalid", f"{self.url} answered unreadably: {exc}", self.url)
        try:
            values = parse_metrics(text)
        except ValueError as exc:
            values = {}
            logger.debug("metrics from %s do not parse: %s", self.url, exc)
        if not any(v is not None for v in values.values()):
            return Health(
                "invalid",
                f"{self.url} answered, but with no ipcount_ metrics: is it the job's metrics "
                "endpoint?",
                self.url,
            )
        return self._health(values)

    def _health(self, v: dict[str, float | None]) -> Health:
        now = time.monotonic()
        batches, batch_sum = v["batches"], v["batch_seconds_sum"]
        batch_seconds = batch_sum / batches if batches and batch_sum is not None else None
        rate = None
        if self._prev is not None:
            then, p = self._prev
            if batches and p["batches"] is not None and batch_sum is not None:
                new = batches - p["batches"]
                if new > 0 and p["batch_seconds_sum"] is not None:
                    batch_seconds = (batch_sum - p["batch_seconds_sum"]) / new
            rec, prev_rec = v["records_total"], p["records_total"]
            if rec is not None and prev_rec is not None and now > then:
                rate = max(0.0, (rec - prev_rec) / (now - then))
        if v["input_rate"] is not None:
            rate = v["input_rate"]  # the job's own figure for its last micro-batch
        self._prev = (now, v)
        up = v["up"]
        return Health(
            "ok",
            "job metrics read" if up is None or up >= 1 else "the job's query is down",
            self.url,
            up=None if up is None else up >= 1,
            lag_records=v["lag_records"],
            watermark_delay_seconds=v["watermark_delay_seconds"],
            batch_seconds=batch_seconds,
            batches=None if batches is None else int(batches),
            records_total=v["records_total"],
            late_total=v["late_total"],
            malformed_total=v["malformed_total"],
            records_per_second=rate,
        )
