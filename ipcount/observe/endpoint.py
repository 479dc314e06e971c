"""The driver's HTTP endpoint: /metrics (Prometheus text via prometheus_client) and /healthz, plus
the lag poller that keeps ipcount_source_lag_records fresh between micro-batches and the watch on
the state store's files (ipcount_state_store_*, and /healthz's "degraded" when snapshots stop)."""

from __future__ import annotations

import logging
import threading
import time
from http.server import BaseHTTPRequestHandler
from typing import Any

from prometheus_client.exposition import choose_encoder

from ipcount.config import Settings
from ipcount.observe.hosts import host_port
from ipcount.observe.httpserve import HttpLimits, HttpServer, http_limits
from ipcount.observe.metrics import JobMetrics, TopicPartition
from ipcount.observe.state_store import StateStorePoller, state_store_poller
from ipcount.queries import COUNTS_QUERY, DEAD_LETTER_QUERY

__all__ = ["MetricsServer", "LagPoller", "Observability"]

logger = logging.getLogger(__name__)


class _Handler(BaseHTTPRequestHandler):
    metrics: JobMetrics  # set on the subclass made per server

    def do_GET(self) -> None:  # noqa: N802 - http.server hook
        path = self.path.split("?", 1)[0]
        if path == "/metrics":
            encoder, content_type = choose_encoder(self.headers.get("Accept", ""))
            self._send(200, encoder(self.metrics.registry), content_type)
        elif path in ("/healthz", "/health"):
            health = self.metrics.health()
            self._send(health.status, (health.reason + "\n").encode(), "text/plain; charset=utf-8")
        else:
            self._send(404, b"not found: try /metrics or /healthz\n", "text/plain; charset=utf-8")

    def _send(self, status: int, body: bytes, content_type: str) -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - http.server hook
        logger.debug("%s " + format, self.address_string(), *args)


class MetricsServer:
    """/metrics and /healthz on host:port (IPv4 or IPv6), served by daemon threads within
    `limits` (settings [http]).

    Raises:
        ConfigError: host:port cannot be bound; the message says whether to change metrics.host
            or metrics.port.
    """

    def __init__(
        self, metrics: JobMetrics, host: str, port: int, limits: HttpLimits | None = None
    ) -> None:
        handler = type("MetricsHandler", (_Handler,), {"metrics": metrics})
        self._server = HttpServer(
            host,
            port,
            handler,
            host_option="metrics.host (env IPCOUNT_METRICS_HOST)",
            port_option="--metrics-port / metrics.port",
            limits=limits,
        )
        self.host, self.port = host, self._server.server_address[1]
        self._thread = threading.Thread(
            target=self._server.serve_forever, name="ipcount-metrics", daemon=True
        )

    def start(self) -> MetricsServer:
        self._thread.start()
        where = host_port(self.host, self.port)
        logger.info("metrics on http://%s/metrics, health on /healthz", where)
        return self

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()


# A ListOffsets call answers in milliseconds. One still in flight after this long (or two poll
# intervals, if longer) means the brokers do not answer (a network partition, a hung broker):
# the lag is unknown from then on, so /healthz cannot keep reporting the last lag it saw.
_UNANSWERED_MIN_S = 5.0


class LagPoller:
    """Every metrics.lag_poll_seconds: the source topic's stable end offsets (one ListOffsets call
    with read_committed, as the source reads) minus the counting query's position, per partition.

    The position is the end offset of the last finished micro-batch; before the first one, the
    last committed batch in the checkpoint's offset log; for a new query, where it starts
    (job.starting_offsets: earliest, or the log end at the first poll for latest).
    A call that has not been answered within `patience` seconds makes the lag unknown, with the
    reason "Kafka at ... has not answered for Ns" (a watch thread, as the call itself may wait
    for its 30 s request timeout).
    """

    def __init__(self, settings: Settings, metrics: JobMetrics) -> None:
        self.settings = settings
        self.metrics = metrics
        self.patience = max(_UNANSWERED_MIN_S, 2 * settings.metrics.lag_poll_seconds)
        self._stop = threading.Event()
        self._reader: Any = None
        self._start: dict[TopicPartition, int] | None = None
        self._asked_at: float | None = None  # when the call in flight began
        self._asked_lock = threading.Lock()
        self._thread = threading.Thread(target=self._run, name="ipcount-lag", daemon=True)
        self._watch = threading.Thread(target=self._watch_calls, name="ipcount-lag-watch")
        self._watch.daemon = True

    def start(self) -> LagPoller:
        self._thread.start()
        self._watch.start()
        return self

    def stop(self, timeout: float | None = None) -> None:
        """Stop polling; wait up to `timeout` seconds (None: kafka.connect_timeout_seconds + 5)
        for a ListOffsets call in flight. A thread still in one closes its consumer itself when
        the call returns: closing it under the call would crash librdkafka."""
        self._stop.set()
        if self._thread.is_alive():
            wait = self.settings.kafka.connect_timeout_seconds + 5 if timeout is None else timeout
            self._thread.join(timeout=wait)
            if self._thread.is_alive():
                logger.debug("lag poller still in a ListOffsets call: it closes its consumer")
                return
        self._close_reader()

    def _close_reader(self) -> None:
        reader, self._reader = self._reader, None
        if reader is not None:
            reader.close()

    def poll_once(self) -> dict[TopicPartition, int]:
        """Lag per partition now.

        Raises:
            IpcountError: the brokers do not answer or the topic is missing.
        """
        reader = self._offsets()
        parts = reader.partitions()
        end = reader.offsets(parts, "latest")
        positions = self.metrics.current_positions()
        if not positions:
            positions = self._start_positions(reader, parts, end)
        return {tp: max(0, end[tp] - positions.get(tp, end[tp])) for tp in parts}

    def _run(self) -> None:
        interval = self.settings.metrics.lag_poll_seconds
        try:
            while not self._stop.is_set():
                with self._asked_lock:
                    self._asked_at = time.monotonic()
                try:
                    lag: dict[TopicPartition, int] | None = self.poll_once()
                    error = ""
                except Exception as exc:  # the job goes on; /healthz reports the unknown lag
                    logger.warning("source lag unknown: %s", exc)
                    lag, error = None, str(exc).splitlines()[0] if str(exc) else repr(exc)
                with self._asked_lock:
                    self._asked_at = None
                    self.metrics.set_lag(lag, error)
                self._stop.wait(interval)
        finally:
            # The consumer is this thread's: stop() may have given up waiting for it.
            self._close_reader()

    def _watch_calls(self) -> None:
        """While a call waits longer than `patience`, the lag is unknown: the brokers do not
        answer."""
        warned: float | None = None
        while not self._stop.wait(min(1.0, self.patience / 4)):
            with self._asked_lock:
                asked = self._asked_at
                waited = 0.0 if asked is None else time.monotonic() - asked
                if asked is None or waited < self.patience:
                    continue
                where = self.settings.kafka.bootstrap_servers
                why = (
                    f"Kafka at {where} has not answered for {waited:.0f}s: check the brokers "
                    "and the network to them (kafka.bootstrap_servers)"
                )
                self.metrics.set_lag(None, why)
            if warned != asked:
                warned = asked
                logger.warning("source lag unknown: %s", why)

    def _offsets(self) -> Any:
        if self._reader is None:
            from ipcount.source.offset_reader import KafkaOffsetReader
            from ipcount.source.options import parse_options, source_options

            # The source's own consumer settings (isolation level, client quirks), without the
            # counting options: end offsets need no combiner, and output=counts would demand
            # the query's checkpoint for its future-skew bound.
            raw = source_options(self.settings, output="records", heartbeats=False)
            opts = parse_options(raw)
            self._reader = KafkaOffsetReader(opts)
        return self._reader

    def _start_positions(
        self, reader: Any, parts: list[TopicPartition], end: dict[TopicPartition, int]
    ) -> dict[TopicPartition, int]:
        if self._start is None:
            self._start = _checkpoint_positions(self.settings.job.checkpoint_location)
        if self._start is None:
            wanted = self.settings.job.starting_offsets.strip()
            self._start = reader.offsets(parts, "earliest") if wanted == "earliest" else dict(end)
        return self._start


def _checkpoint_positions(checkpoint: str) -> dict[TopicPartition, int] | None:
    """The end offsets of the last batch Spark's commit log marks done, if any."""
    from ipcount.checkpoint.offset_log import OffsetLog
    from ipcount.observe.progress import end_offsets

    try:
        log = OffsetLog(checkpoint)
        last = log.last_committed()
        if last is None:
            return None
        return end_offsets({"endOffset": log.source_end(last)}) or None
    except Exception as exc:  # no checkpoint yet, or unreadable: the poller falls back
        logger.debug("no positions from checkpoint %s: %s", checkpoint, exc)
        return None


class Observability:
    """The job's metrics, its Spark listener, the HTTP endpoint and the lag poller, together."""

    def __init__(self, settings: Settings, port: int) -> None:
        from ipcount.observe.metrics import MetricsListener

        queries = (COUNTS_QUERY, DEAD_LETTER_QUERY) if settings.job.dead_letter else None
        trigger = max(settings.job.trigger_interval_seconds, 1.0)
        self.metrics = JobMetrics(
            queries or (COUNTS_QUERY,), stall_seconds=settings.metrics.stall_triggers * trigger
        )
        self.listener = MetricsListener(self.metrics)
        self.settings, self.port = settings, port
        self._server: MetricsServer | None = None
        self._poller: LagPoller | None = None
        self._state: StateStorePoller | None = None

    @classmethod
    def maybe(cls, settings: Settings, port: int | None) -> Observability | None:
        """The endpoint on `port` (None: metrics.port); None when that is 0 (off)."""
        chosen = settings.metrics.port if port is None else port
        return cls(settings, chosen) if chosen else None

    def start(self) -> Observability:
        """Serve /metrics and /healthz on metrics.host:port and start the lag poller.

        Raises:
            ConfigError: metrics.host:port cannot be bound (in use, not an address of this
                machine, a host that does not resolve).
        """
        host = self.settings.metrics.host
        limits = http_limits(self.settings.http)
        self._server = MetricsServer(self.metrics, host, self.port, limits).start()
        self._poller = LagPoller(self.settings, self.metrics).start()
        self._state = state_store_poller(self.settings, self.metrics.state_store).start()
        return self

    def stop(self) -> None:
        self.metrics.stopping()
        if self._poller is not None:
            self._poller.stop()
        if self._state is not None:
            self._state.stop()
        if self._server is not None:
            self._server.stop()
