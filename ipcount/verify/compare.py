"""Exactness check: compare the sink's results with the ground-truth Ledger (duplicates, missing,
wrong counts, late windows). Runs in the `ipcount verify` process (driver/CLI side)."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field

from ipcount.config import Settings
from ipcount.errors import DecodeError
from ipcount.formats.avro import IpCount, make_codec
from ipcount.kafka.consume import SinkRecord, TopicReader
from ipcount.verify.ledger import Ledger

__all__ = ["VerifyReport", "compare", "read_results", "verify_sink"]

_MAX_EXAMPLES = 10


@dataclass
class VerifyReport:
    """The outcome of comparing sink results with a ledger."""

    # (window, ip) keys in the ledger's on-time counts.
    expected: int = 0
    # Sink records read (every copy); results: distinct (window, ip) keys among them.
    records: int = 0
    results: int = 0
    missing: int = 0
    duplicates: int = 0
    wrong: int = 0
    late_windows: int = 0
    late_emitted: int = 0
    isolation: str = "read_committed"
    examples: list[str] = field(default_factory=list)
    total_examples: int = 0

    @property
    def exact(self) -> bool:
        """True when nothing is missing, duplicated or wrong."""
        return self.missing == 0 and self.duplicates == 0 and self.wrong == 0

    def note(self, text: str) -> None:
        self.total_examples += 1
        if len(self.examples) < _MAX_EXAMPLES:
            self.examples.append(text)

    def summary(self) -> str:
        """One line ending with 'results=N missing=M duplicates=D wrong=W exact=true|false'."""
        return (
            f"isolation={self.isolation} records={self.records} expected={self.expected} "
            f"late_windows={self.late_windows} late_emitted={self.late_emitted} "
            f"results={self.results} missing={self.missing} duplicates={self.duplicates} "
            f"wrong={self.wrong} exact={'true' if self.exact else 'false'}"
        )


def _fmt(key: tuple[int, str]) -> str:
    return f"window_start={key[0]} ip={key[1]}"


def compare(
    results: Iterable[tuple[str, IpCount | None]], ledger: Ledger, isolation: str = "read_committed"
) -> VerifyReport:
    """Judge every result against the ledger.

    Args:
        results: (where, record) per sink record; record None means it could not be decoded
            (`where` then holds the reason). Each counts as a result.
        ledger: the merged ground truth.

    Rules: a (window_start, ip) key seen twice is a duplicate. An on-time window must have
    exactly its ledger count (a missing key is missing, another count is wrong). A window holding
    only deliberately late records may be emitted (Spark had not yet passed it) with at most the
    late count (reported as late_emitted). Keys in no ledger, and wrong window lengths, are wrong.
    """
    report = VerifyReport(
        expected=len(ledger.counts), late_windows=len(ledger.late_counts), isolation=isolation
    )
    seen: Counter[tuple[int, str]] = Counter()
    for where, rec in results:
        report.records += 1
        if rec is None:
            report.wrong += 1
            report.note(f"undecodable {where}")
            continue
        key = (rec.window_start, rec.ip)
        seen[key] += 1
        if seen[key] > 1:
            report.duplicates += 1
            report.note(f"duplicate {_fmt(key)} count={rec.count} at {where} (copy {seen[key]})")
            continue
        report.results += 1
        if rec.window_end - rec.window_start != ledger.window_ms:
            report.wrong += 1
            report.note(
                f"wrong window {_fmt(key)}: length {rec.window_end - rec.window_start} ms, "
                f"ledger windows are {ledger.window_ms} ms, at {where}"
            )
            continue
        on_time = ledger.counts.get(key, 0)
        late = ledger.late_counts.get(key, 0)
        if on_time == 0 and late == 0:
            report.wrong += 1
            report.note(f"unexpected {_fmt(key)} count={rec.count} (not in the ledger) at {where}")
        elif on_time <= rec.count <= on_time + late and rec.count > 0:
            report.late_emitted += rec.count - on_time
        else:
            report.wrong += 1
            want = (
                f"{on_time}" if late == 0 else f"{max(on_time, 1)}..{on_time + late} (late {late})"
            )
            report.note(f"wrong {_fmt(key)}: count={rec.count}, expected {want}, at {where}")
    for key, expected in sorted(ledger.counts.items()):
        if expected > 0 and key not in seen:
            report.missing += 1
            report.note(f"missing {_fmt(key)} expected count={expected}")
    return report


def read_results(
    settings: Settings, isolation: str = "read_committed", deadline_seconds: float = 120.0
) -> Iterable[tuple[str, IpCount | None]]:
    """Every record of topics.sink from the beginning to its current end, decoded.

    Undecodable records come back as (reason, None) so verify counts them instead of stopping.
    """
    codec = make_codec(
        settings.sink.wire_format, settings.sink.schema_registry_url, settings.topics.sink
    )
    conf = settings.kafka.to_librdkafka("consumer")
    with TopicReader(
        conf,
        settings.topics.sink,
        isolation=isolation,
        timeout=settings.kafka.connect_timeout_seconds,
    ) as reader:
        rec: SinkRecord
        for rec in reader.read_to_end(deadline_seconds):
            try:
                yield rec.where, codec.decode(rec.value)  # type: ignore[arg-type]
            except DecodeError as exc:
                yield f"{rec.where} ({exc})", None


def verify_sink(
    settings: Settings,
    ledger: Ledger,
    isolation: str = "read_committed",
    deadline_seconds: float = 120.0,
) -> VerifyReport:
    """Read the whole sink topic with `isolation` and compare it with `ledger`."""
    return compare(read_results(settings, isolation, deadline_seconds), ledger, isolation)
