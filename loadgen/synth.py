"""`loadgen synth`: synthetic access records straight to the source topic, at a paced rate or as
fast as possible, with a ledger of what was delivered. Runs in the loadgen process.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from confluent_kafka import KafkaError, KafkaException, Message

from ipcount.config import Settings
from ipcount.errors import ConfigError
from ipcount.verify.ledger import Ledger
from loadgen.generator import (
    DEFAULT_COUNT_EVENT_RATE,
    KIND_LATE,
    KIND_MALFORMED,
    KIND_ON_TIME,
    Batch,
    RecordGenerator,
    SynthSpec,
)
from loadgen.producer import RecordProducer, check_source_topic, producer_config
from loadgen.tally import LedgerTally

__all__ = ["SynthOptions", "SynthResult", "run_synth", "PACE_SLICE_SECONDS"]

logger = logging.getLogger(__name__)

# The token bucket refills in slices this long; small enough that pacing stays smooth.
PACE_SLICE_SECONDS = 0.01
_FLUSH_GRACE_SECONDS = 10.0


@dataclass
class SynthResult:
    """What one synth run delivered (the ledger counts exactly the delivered records)."""

    records: int = 0
    on_time: int = 0
    late: int = 0
    malformed: int = 0
    errors: int = 0
    unreported: int = 0
    dropped: int = 0
    backpressure: int = 0
    seconds: float = 0.0
    produce_seconds: float = 0.0
    interrupted: bool = False
    target: int | None = None
    malformed_kinds: dict[str, int] = field(default_factory=dict)
    first_error: str = ""
    ledger: Ledger | None = None

    @property
    def rate(self) -> float:
        return self.records / self.seconds if self.seconds > 0 else 0.0

    def summary(self) -> str:
        """The one-line summary `loadgen synth` prints."""
        kinds = ",".join(f"{k}:{v}" for k, v in sorted(self.malformed_kinds.items()) if v) or "-"
        text = (
            f"synth: records={self.records} rate={self.rate:.0f}/s on_time={self.on_time} "
            f"late={self.late} malformed={self.malformed} ({kinds}) errors={self.errors} "
            f"unreported={self.unreported} backpressure={self.backpressure} "
            f"seconds={self.seconds:.2f}"
        )
        if self.interrupted:
            text += " interrupted"
        if self.first_error:
            text += f" first_error={self.first_error!r}"
        return text


class _BatchReport:
    """Delivery bookkeeping of one batch: the batch enters the tally once every record of it has
    a report; failed records are taken back out."""

    __slots__ = ("batch", "pending", "_run", "_positions")

    def __init__(self, batch: Batch, run: _Run) -> None:
        self.batch = batch
        self.pending = len(batch)
        self._run = run
        self._positions: dict[bytes, list[int]] | None = None

    def _failed(self, kind: int, err: KafkaError, msg: Message) -> None:
        # Failures are rare: find the record by its bytes (identical records count the same).
        self._run.producer.note_failure(err)
        batch = self.batch
        if self._positions is None:
            self._positions = {}
            for pos, value in enumerate(batch.values):
                self._positions.setdefault(value, []).append(pos)
        candidates = self._positions.get(msg.value() or b"")
        if candidates:
            pos = candidates.pop()
            self._run.tally.remove(
                kind, batch.timestamps[pos], batch.keys[pos], batch.malformed.get(pos)
            )
        else:  # pragma: no cover - a report for a record this batch never produced
            logger.error("delivery report for an unknown record; the ledger may be off by one")

    def _complete(self) -> None:
        self._run.tally.add(self.batch)
        self._run.open_batches -= 1

    # One callback per kind, each inlined: they run once per record, so every call counts.
    def on_time(self, err: KafkaError | None, msg: Message) -> None:
        if err is not None:
            self._failed(KIND_ON_TIME, err, msg)
        self.pending -= 1
        if not self.pending:
            self._complete()

    def late(self, err: KafkaError | None, msg: Message) -> None:
        if err is not None:
            self._failed(KIND_LATE, err, msg)
        self.pending -= 1
        if not self.pending:
            self._complete()

    def malformed(self, err: KafkaError | None, msg: Message) -> None:
        if err is not None:
            self._failed(KIND_MALFORMED, err, msg)
        self.pending -= 1
        if not self.pending:
            self._complete()

    def refused(self, pos: int, exc: KafkaException) -> None:
        # produce() raised: no report will come for this record.
        batch = self.batch
        self._run.tally.remove(
            int(batch.kinds[pos]), batch.timestamps[pos], batch.keys[pos], batch.malformed.get(pos)
        )
        self.pending -= 1
        if not self.pending:
            self._complete()


class _Run:
    def __init__(self, producer: RecordProducer, tally: LedgerTally, gen: RecordGenerator) -> None:
        self.producer = producer
        self.tally = tally
        self.gen = gen
        self.open_batches = 0
        self.sent = 0

    def send(self, n: int, elapsed_s: float) -> None:
        batch = self.gen.next_batch(n, elapsed_s)
        report = _BatchReport(batch, self)
        self.open_batches += 1
        if batch.kinds.any():
            by_kind = (report.on_time, report.late, report.malformed)
            callbacks = [by_kind[k] for k in batch.kinds.tolist()]
        else:
            callbacks = [report.on_time] * len(batch)
        self.producer.produce_batch(
            batch.values, batch.keys, batch.timestamps, callbacks, report.refused
        )
        self.sent += n


@dataclass(frozen=True)
class SynthOptions:
    """How much to send and how fast; where the ledger goes.

    count: stop after this many records (as fast as possible unless `rate` is set).
    rate: records per second (token bucket); with `duration`, stops after rate*duration records.
    duration: seconds to run at `rate`.
    start_ms: first event time (default: now); event time follows the wall clock in rate mode
        unless the spec's event_rate is set, else advances by event_rate records per second.
    """

    count: int | None = None
    rate: float | None = None
    duration: float | None = None
    start_ms: int | None = None
    ledger_path: str | Path | None = None
    batch_size: int = 10_000
    progress_interval: float = 5.0
    producer_overrides: dict[str, str] | None = None

    def validate(self) -> None:
        """Raises:
        ConfigError: naming the option (--count, --rate, --duration) that is wrong."""
        if self.rate is None and self.count is None:
            raise ConfigError(
                "give --count N, or --rate R (with --duration S, or stop with Ctrl-C)"
            )
        if self.rate is not None and self.rate <= 0:
            raise ConfigError(f"--rate must be positive, got {self.rate}")
        if self.duration is not None and (self.rate is None or self.duration <= 0):
            raise ConfigError("--duration needs --rate and must be positive")
        if self.count is not None and self.count < 0:
            raise ConfigError(f"--count must be zero or positive, got {self.count}")

    @property
    def target(self) -> int | None:
        """Records to send: --count, or rate x duration, the smaller; None: until stopped."""
        target = self.count
        if self.rate is not None and self.duration is not None:
            by_time = round(self.rate * self.duration)
            target = by_time if target is None else min(target, by_time)
        return target


def run_synth(
    settings: Settings,
    spec: SynthSpec,
    options: SynthOptions,
    stop: threading.Event | None = None,
) -> SynthResult:
    """Generate and deliver records; write the ledger (delivered records only) at the end.

    Args:
        stop: set it (e.g. from a signal handler) to stop early; the run still flushes and saves.

    Raises:
        ConfigError: bad options or a missing source topic.
    """
    options.validate()
    if options.rate is None and spec.event_rate is None:
        spec = dataclasses.replace(spec, event_rate=DEFAULT_COUNT_EVENT_RATE)
    check_source_topic(settings)
    conf = producer_config(settings, options.producer_overrides)
    producer = RecordProducer(conf, settings.topics.source)
    now_ms = int(time.time() * 1000)
    # Wall-clock event time counts from now_ms, even if building the IP pool takes a while.
    t_event = time.monotonic()
    gen = RecordGenerator(spec, options.start_ms if options.start_ms is not None else now_ms)
    run = _Run(producer, LedgerTally(gen.pool.ips, spec.window_ms), gen)
    target = options.target
    logger.info(
        "synth to %s: target %s records, rate %s/s, %d IPs (%.0f%% IPv6), event time from %d",
        settings.topics.source, target if target is not None else "unbounded",
        f"{options.rate:g}" if options.rate else "max", len(gen.pool), 100 * spec.ipv6_share,
        gen.clock.start_ms,
    )  # fmt: skip
    t0 = time.monotonic()
    interrupted = _produce(run, options, target, stop or threading.Event(), t0, t_event)
    produce_seconds = time.monotonic() - t0
    timeout_ms = float(conf.get("message.timeout.ms", 300_000))
    unreported = producer.flush(timeout_ms / 1000 + _FLUSH_GRACE_SECONDS)
    if unreported or run.open_batches:
        logger.error(
            "%d records without a delivery report (%d batches incomplete): not in the ledger",
            unreported, run.open_batches,
        )  # fmt: skip
    result = _result(run, options, unreported, time.monotonic() - t0, produce_seconds)
    result.interrupted = interrupted
    return result


def _produce(
    run: _Run,
    options: SynthOptions,
    target: int | None,
    stop: threading.Event,
    t0: float,
    t_event: float,
) -> bool:
    """Send until `target` (paced by options.rate, if set) or `stop`; True if stopped."""
    rate, batch_size, producer = options.rate, options.batch_size, run.producer
    next_progress = t0 + options.progress_interval
    while target is None or run.sent < target:
        if stop.is_set():
            return True
        now = time.monotonic()
        elapsed = now - t0
        n = batch_size if rate is None else int(rate * elapsed) - run.sent
        if target is not None:
            n = min(n, target - run.sent)
        while n > 0:
            chunk = min(n, batch_size)
            run.send(chunk, now - t_event)
            n -= chunk
        if now >= next_progress:
            logger.info(
                "synth: %d records sent (%.0f/s), %d awaiting delivery, %d delivery errors",
                run.sent, run.sent / max(elapsed, 1e-9), len(producer), producer.stats.failed,
            )  # fmt: skip
            next_progress = now + options.progress_interval
        if rate is not None:
            # Wait for the next slice, serving delivery reports meanwhile.
            slice_end = t0 + (int(elapsed / PACE_SLICE_SECONDS) + 1) * PACE_SLICE_SECONDS
            producer.poll(max(0.0, slice_end - time.monotonic()))
    return False


def _result(
    run: _Run, options: SynthOptions, unreported: int, seconds: float, produce_seconds: float
) -> SynthResult:
    """Save the ledger (if asked) and sum up what was delivered."""
    tally, stats = run.tally, run.producer.stats
    ledger = tally.to_ledger()
    if options.ledger_path is not None:
        ledger.save(options.ledger_path)
    return SynthResult(
        records=tally.on_time + tally.late + tally.malformed,
        on_time=tally.on_time,
        late=tally.late,
        malformed=tally.malformed,
        errors=stats.failed,
        unreported=unreported,
        backpressure=stats.backpressure,
        seconds=seconds,
        produce_seconds=produce_seconds,
        target=options.target,
        malformed_kinds=dict(tally.malformed_kinds),
        first_error=stats.first_error,
        ledger=ledger,
    )
