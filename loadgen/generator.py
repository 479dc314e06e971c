"""Pure record-generation logic for loadgen (no I/O, loadgen process): records from the skewed IP
pool (loadgen.ip_pool), an event-time clock with jitter, late and malformed records, and each
record's kind, which loadgen.tally turns into the ground-truth ledger."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from datetime import UTC, datetime

import numpy as np

from ipcount.config import MAX_RECORD_BYTES
from ipcount.errors import ConfigError
from ipcount.formats.accesslog import format_record, format_time_local
from ipcount.verify.ledger import window_start_ms
from loadgen.ip_pool import IpPool, zipf_weights

__all__ = [
    "KIND_ON_TIME",
    "KIND_LATE",
    "KIND_MALFORMED",
    "MALFORMED_KINDS",
    "LATE_OFFSET_MS",
    "LATE_SPAN_MS",
    "DEFAULT_COUNT_EVENT_RATE",
    "SynthSpec",
    "IpPool",
    "EventClock",
    "Batch",
    "RecordGenerator",
    "zipf_weights",
    "parse_start",
    "page_tails",
]

KIND_ON_TIME = 0
KIND_LATE = 1
KIND_MALFORMED = 2
MALFORMED_KINDS = ("unparseable", "bad_ip", "bad_timestamp", "non_utf8", "oversized")
# Late records go to a zone that ends this long before the first on-time window, so their windows
# hold no on-time records and lie far behind any watermark (see ipcount.verify.ledger), unless
# SynthSpec.late_behind_seconds puts them just behind the event clock, as a shipper's retries are.
LATE_OFFSET_MS = 3_600_000
LATE_SPAN_MS = 60_000
# --count mode without --event-rate: records per event-time second.
DEFAULT_COUNT_EVENT_RATE = 20_000.0

_BAD_TIMES = (
    "32/Nov/2026:10:00:00 +0000",
    "22/Nov/2026:25:00:00 +0000",
    "22/Foo/2026:10:00:00 +0000",
    "22/Nov/2026:10:61:00 +0000",
    "yesterday",
)


@dataclass(frozen=True)
class SynthSpec:
    """What to generate; validated against the job's settings by `validate()`."""

    ips: int = 1000
    skew: float = 1.1
    ipv6_share: float = 0.1
    jitter_seconds: float = 2.0
    late_fraction: float = 0.0
    # Late records this many seconds behind the event clock at most (uniformly from 1 s), instead
    # of the zone an hour back: those still inside the watermark delay count as on time.
    late_behind_seconds: float | None = None
    malformed_fraction: float = 0.0
    # Records per event-time second; None: event time follows the wall clock.
    event_rate: float | None = None
    seed: int | None = None
    window_ms: int = 5000
    watermark_delay_seconds: float = 5.0
    # job.late_corrections: records behind the watermark become corrections instead of drops.
    late_corrections: bool = False
    max_record_bytes: int = MAX_RECORD_BYTES

    def validate(self) -> None:
        """Raises ConfigError naming the option to fix."""
        if self.ips < 1:
            raise ConfigError(f"--ips must be at least 1, got {self.ips}")
        if self.skew < 0:
            raise ConfigError(f"--skew must be zero (uniform) or positive, got {self.skew}")
        if not 0.0 <= self.ipv6_share <= 1.0:
            raise ConfigError(f"--ipv6-share must be within [0, 1], got {self.ipv6_share}")
        if self.jitter_seconds < 0:
            raise ConfigError(
                f"--jitter-seconds must be zero or positive, got {self.jitter_seconds}"
            )
        # Event times have second precision, so a jitter of j s can put a record ceil(j) s behind
        # the newest one; that must stay inside the watermark delay or Spark drops it, unless
        # late corrections count it (a short delay, e.g. the low-latency profile's 0).
        if (
            not self.late_corrections
            and math.ceil(self.jitter_seconds) >= self.watermark_delay_seconds
        ):
            raise ConfigError(
                f"--jitter-seconds {self.jitter_seconds:g} (rounded up to whole seconds) must be "
                f"below job.watermark_delay_seconds ({self.watermark_delay_seconds:g}) with "
                "job.late_corrections off, or jittered records would fall behind the watermark "
                "and be dropped; lower the jitter, raise the delay or turn late corrections on"
            )
        for name, value in (("late", self.late_fraction), ("malformed", self.malformed_fraction)):
            if not 0.0 <= value <= 1.0:
                raise ConfigError(f"--{name}-fraction must be within [0, 1], got {value}")
        if self.late_fraction + self.malformed_fraction > 1.0:
            raise ConfigError("--late-fraction plus --malformed-fraction must not exceed 1")
        if self.event_rate is not None and self.event_rate <= 0:
            raise ConfigError(f"--event-rate must be positive, got {self.event_rate}")
        if self.window_ms <= 0:
            raise ConfigError(f"job.window_seconds must be positive, got {self.window_ms} ms")
        if self.jitter_seconds * 1000 >= LATE_OFFSET_MS - self.window_ms:
            raise ConfigError("--jitter-seconds must be well below one hour (the late zone offset)")
        behind = self.late_behind_seconds
        if behind is not None and not 1 <= behind < LATE_OFFSET_MS / 1000:
            raise ConfigError(
                f"--late-behind-seconds must be from 1 to below 3600 (an hour), got {behind:g}"
            )


def parse_start(text: str) -> int:
    """Parse --start: epoch milliseconds, or ISO 8601 (naive means UTC). Returns epoch ms.

    Raises:
        ConfigError: neither form.
    """
    value = text.strip()
    if value.lstrip("-").isdigit():
        return int(value)
    try:
        parsed = datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        raise ConfigError(
            f"--start {text!r} is neither epoch milliseconds nor ISO 8601 "
            "(e.g. 2026-11-22T09:57:08Z)"
        ) from None
    if parsed.tzinfo is None:
        parsed = parsed.replace(tzinfo=UTC)
    return int(parsed.timestamp() * 1000)


@dataclass(frozen=True)
class EventClock:
    """Event time before jitter: start + index / event_rate, or start + wall-clock elapsed time."""

    start_ms: int
    event_rate: float | None = None

    def base_times(self, first_index: int, n: int, elapsed_s: float = 0.0) -> np.ndarray:
        if self.event_rate is None:
            return np.full(n, self.start_ms + int(elapsed_s * 1000), dtype=np.int64)
        idx = np.arange(first_index, first_index + n, dtype=np.float64)
        return self.start_ms + (idx * (1000.0 / self.event_rate)).astype(np.int64)


def page_tails() -> list[tuple[str, str, str, int, int, str, str]]:
    """The synthetic request mix: (method, path, protocol, status, bytes, referer, agent) rows."""
    agents = [
        "Mozilla/5.0 (X11; Linux x86_64) AppleWebKit/537.36 (KHTML, like Gecko) Chrome/124.0",
        "Mozilla/5.0 (Macintosh; Intel Mac OS X 14_4) AppleWebKit/605.1.15 Version/17.4",
        "Mozilla/5.0 (Windows NT 10.0; Win64; x64; rv:125.0) Gecko/20100101 Firefox/125.0",
        "curl/8.5.0",
        'Bot "quoted" \\ agent/1.0',
    ]
    site = "https://shop.example.com"
    rows: list[tuple[str, str, str, int, int, str, str]] = []
    for i, agent in enumerate(agents):
        rows += [
            ("GET", "/", "HTTP/1.1", 200, 2311 + i, "-", agent),
            ("GET", "/products", "HTTP/1.1", 200, 5120 + 3 * i, f"{site}/", agent),
            (
                "GET",
                f"/products/{17 + 31 * i}",
                "HTTP/1.1",
                200,
                1843 + i,
                f"{site}/products",
                agent,
            ),
            ("GET", f"/search?q=blue+shoes&page={i}", "HTTP/2.0", 200, 977, f"{site}/", agent),
            ("POST", "/cart", "HTTP/1.1", 201, 48, f"{site}/products/{17 + 31 * i}", agent),
            ("GET", "/static/css/site.css", "HTTP/1.1", 200, 3921, f"{site}/", agent),
            ("GET", "/static/img/logo.png", "HTTP/1.1", 304, 0, f"{site}/", agent),
            ("GET", "/wp-login.php", "HTTP/1.0", 404, 162, "-", agent),
        ]
    return rows


def _tail(row: tuple[str, str, str, int, int, str, str]) -> str:
    # Everything after "] " of format_record: the one formatter stays the source of truth.
    method, path, protocol, status, size, referer, agent = row
    line = format_record(
        "192.0.2.1", 0, method=method, path=path, protocol=protocol, status=status,
        body_bytes=size, referer=referer, user_agent=agent,
    )  # fmt: skip
    return line.split("] ", 1)[1]


@dataclass
class Batch:
    """One batch of generated records, parallel lists/arrays in produce order."""

    values: list[bytes]
    keys: list[bytes | None]
    timestamps: list[int]
    kinds: np.ndarray
    ip_idx: np.ndarray
    event_ms: np.ndarray
    # Index in the batch -> malformed kind name (MALFORMED_KINDS).
    malformed: dict[int, str] = field(default_factory=dict)

    def __len__(self) -> int:
        return len(self.values)


class RecordGenerator:
    """Turns (count, elapsed time) into batches of access records; deterministic for a seed,
    a start time and a sequence of batch sizes."""

    def __init__(self, spec: SynthSpec, start_ms: int) -> None:
        spec.validate()
        self.spec = spec
        self.rng = np.random.default_rng(spec.seed)
        self.pool = IpPool(spec.ips, spec.skew, spec.ipv6_share, self.rng)
        self.clock = EventClock(start_ms, spec.event_rate)
        self._start = start_ms
        self._jitter_ms = int(spec.jitter_seconds * 1000)
        first_window = window_start_ms(start_ms - self._jitter_ms, spec.window_ms)
        self.late_zone_end_ms = window_start_ms(first_window - LATE_OFFSET_MS, spec.window_ms)
        self.late_zone_start_ms = self.late_zone_end_ms - LATE_SPAN_MS
        self._tails = [_tail(row) for row in page_tails()]
        self._tail_bytes = [b"] " + t.encode() for t in self._tails]
        self._ip_prefixes = [ip.encode() + b" - - [" for ip in self.pool.ips]
        self._time_cache: dict[int, str] = {}
        self._next = 0

    def _time_local(self, second: int) -> str:
        text = self._time_cache.get(second)
        if text is None:
            if len(self._time_cache) > 100_000:
                self._time_cache.clear()
            text = self._time_cache[second] = format_time_local(second * 1000)
        return text

    def next_batch(self, n: int, elapsed_s: float = 0.0) -> Batch:
        """The next n records; `elapsed_s` (seconds since the start) drives wall-clock mode."""
        rng, spec = self.rng, self.spec
        base = self.clock.base_times(self._next, n, elapsed_s)
        self._next += n
        u = rng.random(n)
        kinds = np.full(n, KIND_ON_TIME, dtype=np.int8)
        kinds[u < spec.late_fraction] = KIND_LATE
        kinds[(u >= spec.late_fraction) & (u < spec.late_fraction + spec.malformed_fraction)] = (
            KIND_MALFORMED
        )
        ip_idx = self.pool.sample(n, rng)
        event = base
        if self._jitter_ms:
            # Jitter only backwards: a record is never more than the jitter behind the newest one.
            event = base - (rng.random(n) * self._jitter_ms).astype(np.int64)
        late = kinds == KIND_LATE
        if late.any():
            event = self._place_late(event, base, late)
        event = event - event % 1000  # nginx $time_local has second precision
        if late.any() and spec.late_behind_seconds is not None:
            self._on_time_if_inside_delay(kinds, event, base, late)
        tails = rng.integers(0, len(self._tails), n)

        # Each line is ip_prefix + (time, tail) combination, both precomputed bytes: one
        # concatenation per record instead of formatting.
        seconds_arr = event // 1000
        base_s = int(seconds_arr.min()) if n else 0
        combo_keys = (seconds_arr - base_s) * len(self._tails) + tails
        uniq, inverse = np.unique(combo_keys, return_inverse=True)
        nt, tl, tb = len(self._tails), self._time_local, self._tail_bytes
        combos = [tl(base_s + k // nt).encode() + tb[k % nt] for k in uniq.tolist()]
        prefixes = self._ip_prefixes
        values = [
            prefixes[i] + combos[j]
            for i, j in zip(ip_idx.tolist(), inverse.reshape(-1).tolist(), strict=True)
        ]
        ips = self.pool.ips
        seconds = seconds_arr.tolist()
        pkeys = self.pool.keys
        keys: list[bytes | None] = [pkeys[i] for i in ip_idx.tolist()]
        batch = Batch(values, keys, event.tolist(), kinds, ip_idx, event)
        bad = np.flatnonzero(kinds == KIND_MALFORMED)
        if bad.size:
            which = rng.integers(0, len(MALFORMED_KINDS), bad.size).tolist()
            for pos, k in zip(bad.tolist(), which, strict=True):
                kind = MALFORMED_KINDS[k]
                batch.values[pos], batch.keys[pos] = self._malformed(
                    kind, ips[int(ip_idx[pos])], seconds[pos], int(tails[pos])
                )
                batch.malformed[pos] = kind
        return batch

    def _place_late(self, event: np.ndarray, base: np.ndarray, late: np.ndarray) -> np.ndarray:
        """Event times of the late records: in the zone an hour back, or up to
        late_behind_seconds behind the event clock, never before the first record (a shipper
        retries records it saw, so none from before the traffic began)."""
        event, n = event.copy(), int(late.sum())
        if self.spec.late_behind_seconds is None:
            event[late] = self.late_zone_start_ms + self.rng.integers(0, LATE_SPAN_MS, n)
        else:
            most = np.minimum(int(self.spec.late_behind_seconds * 1000), base[late] - self._start)
            event[late] = base[late] - (self.rng.random(n) * most).astype(np.int64)
        return event

    def _on_time_if_inside_delay(
        self, kinds: np.ndarray, event: np.ndarray, base: np.ndarray, late: np.ndarray
    ) -> None:
        """A record sent behind the clock but by fewer whole seconds than the watermark delay is
        on time (the rule jitter keeps to): the job counts it in its window's final count, and
        the ledger must say so. Those further behind stay late: a correction, or part of the
        final count when the watermark had not passed their window yet (verify allows both)."""
        newest_s = (base - base % 1000) // 1000
        behind_s = newest_s - event // 1000
        kinds[late & (behind_s < self.spec.watermark_delay_seconds)] = KIND_ON_TIME

    def _malformed(self, kind: str, ip: str, second: int, tail: int) -> tuple[bytes, bytes | None]:
        rng = self.rng
        good = f"{ip} - - [{self._time_local(second)}] {self._tails[tail]}"
        if kind == "unparseable":
            return f"{ip} {self._tails[tail]} <- not a combined-format line".encode(), None
        if kind == "bad_ip":
            bad_ip = f"{int(rng.integers(256, 1000))}.{int(rng.integers(0, 256))}.1.1"
            return good.replace(ip, bad_ip, 1).encode(), bad_ip.encode()
        if kind == "bad_timestamp":
            bad_time = _BAD_TIMES[int(rng.integers(0, len(_BAD_TIMES)))]
            return good.replace(self._time_local(second), bad_time, 1).encode(), ip.encode()
        if kind == "non_utf8":
            # Invalid bytes inside the IP field: malformed whether a reader rejects the bytes or
            # replaces them with U+FFFD.
            return b"\xff\xfe" + good.encode()[1:], None
        # oversized: a line longer than max_record_bytes cut off before its end (as a shipper
        # with a line limit leaves it): no nginx writes it, so the job rejects it at any length.
        pad = self.spec.max_record_bytes + int(rng.integers(1, 200))
        line = format_record(ip, second * 1000, path="/search?q=" + "x" * pad, status=414)
        return line[: line.index(" HTTP/")].encode(), ip.encode()
