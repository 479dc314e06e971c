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

__all__ = ["SynthResult", "run_synth", "PACE_SLICE_SECONDS"]

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


def run_synth(
    settings: Settings,
    spec: SynthSpec,
    *,
    count: int | None = None,
    rate: float | None = None,
    duration: float | None = None,
    start_ms: int | None = None,
    ledger_path: str | Path | None = None,
    batch_size: int = 10_000,
    stop: threading.Event | None = None,
    progress_interval: float = 5.0,
    producer_overrides: dict[str, str] | None = None,
) -> SynthResult:
    """Generate and deliver records; write the ledger (delivered records only) at the end.

    Args:
        count: stop after this many records (as fast as possible unless `rate` is set).
        rate: records per second (token bucket); with `duration`, stops after rate*duration records.
        duration: seconds to run at `rate`.
        start_ms: first event time (default: now); event time follows the wall clock in rate mode
            unless `spec.event_rate` is set, else advances by `spec.event_rate` records per second.
        stop: set it (e.g. from a signal handler) to stop early; the run still flushes and saves.

    Raises:
        ConfigError: bad options or a missing source topic.
    """
    if rate is None and count is None:
        raise ConfigError("give --count N, or --rate R (with --duration S, or stop with Ctrl-C)")
    if rate is not None and rate <= 0:
        raise ConfigError(f"--rate must be positive, got {rate}")
    if duration is not None and (rate is None or duration <= 0):
        raise ConfigError("--duration needs --rate and must be positive")
    if count is not None and count < 0:
        raise ConfigError(f"--count must be zero or positive, got {count}")
    if rate is None and spec.event_rate is None:
        spec = dataclasses.replace(spec, event_rate=DEFAULT_COUNT_EVENT_RATE)
    target = count
    if rate is not None and duration is not None:
        by_time = round(rate * duration)
        target = by_time if target is None else min(target, by_time)
    check_source_topic(settings)
    stop = stop or threading.Event()
    conf = producer_config(settings, producer_overrides)
    producer = RecordProducer(conf, settings.topics.source)
    now_ms = int(time.time() * 1000)
    # Wall-clock event time counts from now_ms, even if building the IP pool takes a while.
    t_event = time.monotonic()
    gen = RecordGenerator(spec, start_ms if start_ms is not None else now_ms)
    tally = LedgerTally(gen.pool.ips, spec.window_ms)
    run = _Run(producer, tally, gen)
    logger.info(
        "synth to %s: target %s records, rate %s/s, %d IPs (%.0f%% IPv6), event time from %d",
        settings.topics.source, target if target is not None else "unbounded",
        f"{rate:g}" if rate else "max", len(gen.pool), 100 * spec.ipv6_share, gen.clock.start_ms,
    )  # fmt: skip

    t0 = time.monotonic()
    next_progress = t0 + progress_interval
    interrupted = False
    while target is None or run.sent < target:
        if stop.is_set():
            interrupted = True
            break
        now = time.monotonic()
        elapsed = now - t0
        if rate is None:
            n = batch_size
        else:
            n = int(rate * elapsed) - run.sent
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
            next_progress = now + progress_interval
        if rate is not None:
            # Wait for the next slice, serving delivery reports meanwhile.
            slice_end = t0 + (int(elapsed / PACE_SLICE_SECONDS) + 1) * PACE_SLICE_SECONDS
            producer.poll(max(0.0, slice_end - time.monotonic()))
    produce_seconds = time.monotonic() - t0
    timeout_ms = float(conf.get("message.timeout.ms", 300_000))
    unreported = producer.flush(timeout_ms / 1000 + _FLUSH_GRACE_SECONDS)
    seconds = time.monotonic() - t0
    if unreported or run.open_batches:
        logger.error(
            "%d records without a delivery report (%d batches incomplete): not in the ledger",
            unreported, run.open_batches,
        )  # fmt: skip

    ledger = tally.to_ledger()
    if ledger_path is not None:
        ledger.save(ledger_path)
    stats = producer.stats
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
        interrupted=interrupted,
        target=target,
        malformed_kinds=dict(tally.malformed_kinds),
        first_error=stats.first_error,
        ledger=ledger,
    )
