"""Exactness check: compare the sink's results (and the late-count corrections) with the
ground-truth Ledger (duplicates, missing, wrong counts; windows the job still keeps open are open,
not missing). Runs in the `ipcount verify` process (driver/CLI side)."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field

from ipcount.config import Settings
from ipcount.errors import DecodeError
from ipcount.formats.avro import IpCount, make_codec
from ipcount.kafka.records import SinkRecord
from ipcount.kafka.topic_reader import TopicReader
from ipcount.verify.ledger import Ledger
from ipcount.verify.watermark import SinkWatermark

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
    # Ledger keys without a result whose window ends after the sink's watermark (not yet emitted).
    open: int = 0
    # The verdicts (exact: all three 0). Missing: a due ledger key with no result (or, with
    # corrections, whose total falls short to nothing); duplicates: copies of a key past the
    # first; wrong: an undecodable record, a key in no ledger, a wrong window length or count.
    missing: int = 0
    duplicates: int = 0
    wrong: int = 0
    # Keys the ledgers hold deliberately late records for, and the late records counted in the
    # job's results (not corrections) because Spark had not yet passed their window.
    late_windows: int = 0
    late_emitted: int = 0
    # Correction records read from topics.late, and the records they count (None: not read).
    corrections: int | None = None
    corrected: int = 0
    isolation: str = "read_committed"
    examples: list[str] = field(default_factory=list)
    total_examples: int = 0
    # The watermark open windows were judged by (None: unknown, every absent result is missing).
    watermark: SinkWatermark | None = None

    @property
    def exact(self) -> bool:
        """True when nothing is missing, duplicated or wrong (open windows are not yet due)."""
        return self.missing == 0 and self.duplicates == 0 and self.wrong == 0

    def open_hint(self) -> str | None:
        """One line on the open windows and how to close them (None: there are none)."""
        if self.open == 0 or self.watermark is None:
            return None
        return (
            f"open: {self.open} (window, ip) results are not emitted yet: their windows end "
            f"after the sink's watermark {self.watermark}, so the job still holds them. If the "
            "input is finished, `ipcount run --available-now --close-all-windows` emits them; a "
            "live job emits them once newer records (or, when input stops, its idle heartbeats) "
            "move the watermark past them"
        )

    def note(self, text: str) -> None:
        self.total_examples += 1
        if len(self.examples) < _MAX_EXAMPLES:
            self.examples.append(text)

    def summary(self) -> str:
        """One line ending with 'open=O results=N missing=M duplicates=D wrong=W
        exact=true|false'."""
        late = (
            f"corrections={self.corrections} corrected={self.corrected} "
            if self.corrections is not None
            else ""
        )
        return (
            f"isolation={self.isolation} records={self.records} expected={self.expected} "
            f"late_windows={self.late_windows} late_emitted={self.late_emitted} {late}"
            f"open={self.open} results={self.results} missing={self.missing} "
            f"duplicates={self.duplicates} "
            f"wrong={self.wrong} exact={'true' if self.exact else 'false'}"
        )


def _fmt(key: tuple[int, str]) -> str:
    return f"window_start={key[0]} ip={key[1]}"


def _absent(report: VerifyReport, key: tuple[int, str], expected: int, window_ms: int) -> None:
    """A ledger key with no result at all: open while its window ends after the watermark."""
    if report.watermark is not None and not report.watermark.closes(key[0] + window_ms):
        report.open += 1
    else:
        report.missing += 1
        report.note(f"missing {_fmt(key)} expected count={expected}")


def compare(
    results: Iterable[tuple[str, IpCount | None]],
    ledger: Ledger,
    isolation: str = "read_committed",
    corrections: Iterable[tuple[str, IpCount | None]] | None = None,
    watermark: SinkWatermark | None = None,
) -> VerifyReport:
    """Judge every result against the ledger.

    Args:
        results: (where, record) per sink record; record None means it could not be decoded
            (`where` then holds the reason). Each counts as a result.
        ledger: the merged ground truth.
        corrections: the late-count corrections (topics.late), same form; None when the job
            writes none (job.late_corrections = false).
        watermark: how far the job has emitted (None: unknown). A ledger key with no result
            whose window ends after it is open (counted, not yet emitted), not missing.

    Rules: a (window_start, ip) key seen twice in the sink is a duplicate; keys in no ledger, and
    wrong window lengths, are wrong. With corrections, every key's final count plus its
    corrections must equal the ledger's total (on-time plus late records): a short total is
    missing (nothing at all) or wrong. Without them, an on-time window must have exactly its
    ledger count, and a window holding only deliberately late records may be emitted (Spark had
    not yet passed it) with at most the late count (reported as late_emitted).
    """
    report = VerifyReport(
        expected=len(ledger.counts),
        late_windows=len(ledger.late_counts),
        isolation=isolation,
        watermark=watermark,
    )
    if corrections is not None:
        return _compare_totals(results, corrections, ledger, report)
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
            _absent(report, key, expected, ledger.window_ms)
    return report


def _decoded(
    rows: Iterable[tuple[str, IpCount | None]],
    window_ms: int,
    report: VerifyReport,
    what: str,
) -> Iterable[tuple[tuple[int, str], IpCount, str]]:
    """Decodable records of the right window length; the others are noted as wrong."""
    for where, rec in rows:
        if rec is None:
            report.wrong += 1
            report.note(f"undecodable {what} {where}")
        elif rec.window_end - rec.window_start != window_ms:
            report.wrong += 1
            report.note(
                f"wrong window in {what} {_fmt((rec.window_start, rec.ip))}: length "
                f"{rec.window_end - rec.window_start} ms, ledger windows are {window_ms} ms, "
                f"at {where}"
            )
        else:
            yield (rec.window_start, rec.ip), rec, where


def _compare_totals(
    results: Iterable[tuple[str, IpCount | None]],
    corrections: Iterable[tuple[str, IpCount | None]],
    ledger: Ledger,
    report: VerifyReport,
) -> VerifyReport:
    finals: dict[tuple[int, str], int] = {}
    fixes: Counter[tuple[int, str]] = Counter()
    report.corrections = 0
    for where, rec in results:
        report.records += 1
        for key, one, at in _decoded([(where, rec)], ledger.window_ms, report, "result"):
            if key in finals:
                report.duplicates += 1
                report.note(f"duplicate {_fmt(key)} count={one.count} at {at}")
                continue
            report.results += 1
            finals[key] = one.count
            report.late_emitted += max(0, one.count - ledger.counts.get(key, 0))
    for key, one, _at in _decoded(corrections, ledger.window_ms, report, "correction"):
        report.corrections += 1
        report.corrected += one.count
        fixes[key] += one.count
    for key in sorted(set(finals) | set(fixes) | set(ledger.counts) | set(ledger.late_counts)):
        expected = ledger.counts.get(key, 0) + ledger.late_counts.get(key, 0)
        final, fix = finals.get(key), fixes.get(key, 0)
        total = (final or 0) + fix
        if total == expected:
            continue
        if expected == 0:
            report.wrong += 1
            report.note(f"unexpected {_fmt(key)} count={final} corrections={fix} (not in ledger)")
        elif final is None and fix == 0:
            _absent(report, key, expected, ledger.window_ms)
        else:
            report.wrong += 1
            report.note(
                f"wrong {_fmt(key)}: count={final} + corrections={fix} = {total}, expected "
                f"{expected} (on time {ledger.counts.get(key, 0)}, late "
                f"{ledger.late_counts.get(key, 0)})"
            )
    return report


def read_results(
    settings: Settings,
    isolation: str = "read_committed",
    deadline_seconds: float = 120.0,
    topic: str | None = None,
) -> Iterable[tuple[str, IpCount | None]]:
    """Every record of topics.sink (or `topic`, e.g. topics.late) from the beginning to its
    current end, decoded.

    Undecodable records come back as (reason, None) so verify counts them instead of stopping.
    """
    name = topic or settings.topics.sink
    codec = make_codec(settings.sink.wire_format, settings.sink.schema_registry_url, name)
    conf = settings.kafka.to_librdkafka("consumer")
    setting = "topics.late" if name == settings.topics.late else "topics.sink"
    with TopicReader(
        conf,
        name,
        isolation=isolation,
        timeout=settings.kafka.connect_timeout_seconds,
        topic_setting=setting,
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
    with_late: bool | None = None,
    watermark: SinkWatermark | None = None,
) -> VerifyReport:
    """Read the whole sink topic (and, with `with_late`, default job.late_corrections, the late
    corrections) with `isolation` and compare them with `ledger`. `watermark`: read it (with
    `sink_watermark`) before the sink, so every window it closes is in what is read."""
    late = settings.job.late_corrections if with_late is None else with_late
    corrections = (
        list(read_results(settings, isolation, deadline_seconds, settings.topics.late))
        if late
        else None
    )
    results = read_results(settings, isolation, deadline_seconds)
    return compare(results, ledger, isolation, corrections, watermark)
