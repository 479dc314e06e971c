"""loadgen's pure generation logic: format fidelity, skew, IPv6 share, jitter, late placement,
malformed kinds, determinism, and the delivered-records tally."""

from __future__ import annotations

import math
import re
from collections import Counter

import numpy as np
import pytest

from ipcount.errors import ConfigError
from ipcount.formats.accesslog import IP_PATTERN, ParseError, format_record, parse_record
from ipcount.verify.ledger import window_start_ms
from loadgen.generator import (
    KIND_LATE,
    KIND_MALFORMED,
    KIND_ON_TIME,
    LATE_OFFSET_MS,
    MALFORMED_KINDS,
    IpPool,
    RecordGenerator,
    SynthSpec,
    page_tails,
    parse_start,
    zipf_weights,
)
from loadgen.tally import LedgerTally

START = 1_795_341_600_000  # 2026-11-22T10:00:00Z
MAX_BYTES = 8192


def _gen(**kw: object) -> RecordGenerator:
    spec = SynthSpec(**{"seed": 11, "event_rate": 2000.0, **kw})  # type: ignore[arg-type]
    return RecordGenerator(spec, START)


def _rejected(value: bytes) -> bool:
    """The job's rule: not parseable (at any length)."""
    try:
        parse_record(value)
    except ParseError:
        return True
    return False


def test_records_parse_back_with_the_jobs_regexes() -> None:
    gen = _gen(ips=300, ipv6_share=0.5)
    batch = gen.next_batch(20_000)
    ip_re = re.compile(IP_PATTERN)
    v6 = 0
    for value, key, ts, idx in zip(batch.values, batch.keys, batch.timestamps, batch.ip_idx):
        rec = parse_record(value)
        assert rec.ip == gen.pool.ips[idx]
        assert ip_re.match(rec.ip)
        assert key == rec.ip.encode()
        # The Kafka timestamp is the event time as written in the line (whole seconds).
        assert rec.event_ms == ts and ts % 1000 == 0
        v6 += ":" in rec.ip
    assert 0.45 < v6 / len(batch) < 0.55
    assert any("::" in ip for ip in gen.pool.ips)  # compressed IPv6 forms occur too


def test_lines_are_exactly_format_record() -> None:
    gen = _gen(ips=50, ipv6_share=0.3)
    batch = gen.next_batch(500)
    rows = page_tails()
    for value, idx, ts in zip(batch.values, batch.ip_idx, batch.timestamps):
        ip = gen.pool.ips[idx]
        expected = {
            format_record(
                ip, ts, method=m, path=p, protocol=proto, status=st, body_bytes=b,
                referer=ref, user_agent=ua,
            ).encode()
            for m, p, proto, st, b, ref, ua in rows
        }  # fmt: skip
        assert value in expected


def test_zipf_skew_follows_the_weights() -> None:
    rng = np.random.default_rng(3)
    pool = IpPool(100, 1.1, 0.0, rng)
    n = 400_000
    freq = np.bincount(pool.sample(n, rng), minlength=100) / n
    expected = zipf_weights(100, 1.1)
    assert np.allclose(freq[:5], expected[:5], rtol=0.03)
    assert list(freq[:5]) == sorted(freq[:5], reverse=True)
    assert freq[0] / expected[0] == pytest.approx(1.0, rel=0.03)
    # s=1.1: rank 1 is 2**1.1 times as frequent as rank 2.
    assert freq[0] / freq[1] == pytest.approx(2**1.1, rel=0.05)


def test_skew_zero_is_uniform() -> None:
    rng = np.random.default_rng(4)
    pool = IpPool(50, 0.0, 0.0, rng)
    freq = np.bincount(pool.sample(200_000, rng), minlength=50) / 200_000
    assert freq.min() > 0.016 and freq.max() < 0.024


@pytest.mark.parametrize("share", [0.0, 0.1, 0.3, 1.0])
def test_ipv6_share_of_records(share: float) -> None:
    rng = np.random.default_rng(5)
    pool = IpPool(1000, 1.1, share, rng)
    idx = pool.sample(100_000, rng)
    got = pool.is_ipv6[idx].mean()
    assert got == pytest.approx(share, abs=0.01)
    assert all((":" in ip) == bool(v6) for ip, v6 in zip(pool.ips, pool.is_ipv6))
    assert len(set(pool.ips)) == 1000


def test_jitter_stays_within_bounds() -> None:
    jitter = 2.5
    gen = _gen(ips=20, jitter_seconds=jitter, event_rate=1000.0)
    batch = gen.next_batch(30_000)
    base = START + (np.arange(30_000) * 1.0).astype(np.int64)
    ev = batch.event_ms
    assert (ev <= base - base % 1000).all()
    assert (ev >= (base - jitter * 1000) // 1000 * 1000).all()
    assert (base - ev).max() > 2000  # the jitter is actually used
    # Behind the newest event seen so far by at most ceil(jitter) s: inside the watermark delay.
    lateness = np.maximum.accumulate(ev) - ev
    assert lateness.max() <= math.ceil(jitter) * 1000 < 5000


def test_no_jitter_means_in_order() -> None:
    batch = _gen(jitter_seconds=0).next_batch(10_000)
    assert (np.diff(batch.event_ms) >= 0).all()


def test_wall_clock_mode_uses_elapsed_time() -> None:
    gen = RecordGenerator(SynthSpec(seed=1, jitter_seconds=0, event_rate=None), START)
    assert set(gen.next_batch(10, 0.2).timestamps) == {START}
    assert set(gen.next_batch(10, 3.7).timestamps) == {START + 3000}


def test_late_records_sit_in_their_own_windows_an_hour_back() -> None:
    gen = _gen(ips=100, late_fraction=0.2, jitter_seconds=2)
    batch = gen.next_batch(50_000)
    late = batch.kinds == KIND_LATE
    on_time = batch.kinds == KIND_ON_TIME
    assert late.mean() == pytest.approx(0.2, abs=0.01)
    lt, ot = batch.event_ms[late], batch.event_ms[on_time]
    assert gen.late_zone_start_ms <= lt.min() and lt.max() < gen.late_zone_end_ms
    assert ot.min() - lt.max() >= LATE_OFFSET_MS
    late_windows = {window_start_ms(int(t), 5000) for t in lt}
    on_time_windows = {window_start_ms(int(t), 5000) for t in ot}
    assert len(late_windows) >= 10 and not late_windows & on_time_windows
    for i in np.flatnonzero(late)[:200]:
        assert parse_record(batch.values[i]).event_ms == batch.timestamps[i]


def test_malformed_records_of_every_kind_are_rejected() -> None:
    gen = _gen(ips=100, ipv6_share=0.5, malformed_fraction=0.5, max_record_bytes=MAX_BYTES)
    batch = gen.next_batch(4000)
    bad = np.flatnonzero(batch.kinds == KIND_MALFORMED)
    assert set(batch.malformed) == set(bad.tolist())
    assert set(batch.malformed.values()) == set(MALFORMED_KINDS)
    for pos, kind in batch.malformed.items():
        value = batch.values[pos]
        assert _rejected(value), (kind, value[:120])
        # Also rejected by a reader that replaces invalid UTF-8 (as a JVM string cast does).
        assert _rejected(value.decode("utf-8", "replace").encode()), kind
        if kind == "oversized":
            assert len(value) > MAX_BYTES  # long, and cut off: no nginx writes it
        if kind == "non_utf8":
            with pytest.raises(UnicodeDecodeError):
                value.decode("utf-8")
        if kind == "bad_ip":
            assert re.match(rb"^\d{3}\.\d+\.1\.1 ", value)
    good = [v for i, v in enumerate(batch.values) if i not in batch.malformed]
    assert not any(_rejected(v) for v in good)


def test_same_seed_same_records() -> None:
    a, b, c = (
        _gen(seed=42, late_fraction=0.1, malformed_fraction=0.1),
        _gen(seed=42, late_fraction=0.1, malformed_fraction=0.1),
        _gen(seed=43, late_fraction=0.1, malformed_fraction=0.1),
    )
    for n in (100, 5000, 7):
        ba, bb, bc = a.next_batch(n), b.next_batch(n), c.next_batch(n)
        assert ba.values == bb.values and ba.keys == bb.keys and ba.timestamps == bb.timestamps
        assert ba.values != bc.values
    assert a.pool.ips == b.pool.ips


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"jitter_seconds": 5.0}, "watermark_delay_seconds"),
        ({"jitter_seconds": 4.5}, "rounded up"),
        ({"late_fraction": 0.7, "malformed_fraction": 0.6}, "must not exceed 1"),
        ({"ipv6_share": 1.5}, "--ipv6-share"),
        ({"ips": 0}, "--ips"),
        ({"event_rate": 0.0}, "--event-rate"),
    ],
)
def test_spec_validation(changes: dict[str, object], message: str) -> None:
    with pytest.raises(ConfigError, match=re.escape(message)):
        SynthSpec(**changes).validate()  # type: ignore[arg-type]


def test_jitter_just_inside_the_delay_is_allowed() -> None:
    SynthSpec(jitter_seconds=4.0, watermark_delay_seconds=5.0).validate()
    SynthSpec(jitter_seconds=0.0, watermark_delay_seconds=0.5).validate()


def test_jitter_past_the_delay_needs_late_corrections() -> None:
    # The low-latency profile: no watermark delay, out-of-order records counted as corrections.
    with pytest.raises(ConfigError, match="turn late corrections on"):
        SynthSpec(jitter_seconds=2.0, watermark_delay_seconds=0.0).validate()
    SynthSpec(jitter_seconds=2.0, watermark_delay_seconds=0.0, late_corrections=True).validate()


def test_parse_start() -> None:
    assert parse_start("1795341600000") == START
    assert parse_start("2026-11-22T10:00:00Z") == START
    assert parse_start("2026-11-22T10:00:00") == START
    assert parse_start("2026-11-22T11:00:00+01:00") == START
    with pytest.raises(ConfigError, match="ISO 8601"):
        parse_start("last tuesday")


def test_tally_counts_delivered_records_only() -> None:
    gen = _gen(ips=40, ipv6_share=0.3, late_fraction=0.05, malformed_fraction=0.05)
    tally = LedgerTally(gen.pool.ips, 5000)
    expected: Counter[tuple[int, str]] = Counter()
    expected_late: Counter[tuple[int, str]] = Counter()
    malformed = 0
    for n in (3000, 1, 4000):
        batch = gen.next_batch(n)
        tally.add(batch)
        for kind, idx, ts in zip(batch.kinds, batch.ip_idx, batch.timestamps):
            slot = (window_start_ms(ts, 5000), gen.pool.ips[idx])
            if kind == KIND_ON_TIME:
                expected[slot] += 1
            elif kind == KIND_LATE:
                expected_late[slot] += 1
            else:
                malformed += 1
        # Take back two records whose delivery "failed".
        for kind in (KIND_ON_TIME, KIND_LATE, KIND_MALFORMED):
            pos = int(np.flatnonzero(batch.kinds == kind)[0]) if (batch.kinds == kind).any() else -1
            if pos < 0:
                continue
            tally.remove(kind, batch.timestamps[pos], batch.keys[pos])
            slot = (window_start_ms(batch.timestamps[pos], 5000), gen.pool.ips[batch.ip_idx[pos]])
            if kind == KIND_ON_TIME:
                expected[slot] -= 1
            elif kind == KIND_LATE:
                expected_late[slot] -= 1
            else:
                malformed -= 1
    ledger = tally.to_ledger()
    assert ledger.counts == +expected
    assert ledger.late_counts == +expected_late
    assert ledger.malformed == malformed == tally.malformed
    assert ledger.on_time == tally.on_time and ledger.late == tally.late


def _simulate_job(
    gen: RecordGenerator, batches: int, size: int, delay_ms: int
) -> tuple[Counter[tuple[int, str]], Counter[tuple[int, str]], LedgerTally]:
    """The job's rule on the generator's records, one generator batch per micro-batch: a record
    is late when its window ends at or before the previous batches' newest event time less the
    delay (the watermark that batch is judged by). Returns the final counts, the corrections and
    the tally of every record delivered."""
    tally = LedgerTally(gen.pool.ips, 5000)
    finals: Counter[tuple[int, str]] = Counter()
    fixes: Counter[tuple[int, str]] = Counter()
    newest = None
    for _ in range(batches):
        batch = gen.next_batch(size)
        tally.add(batch)
        watermark = None if newest is None else newest - delay_ms
        counted = batch.kinds != KIND_MALFORMED
        for t, i in zip(
            batch.event_ms[counted].tolist(), batch.ip_idx[counted].tolist(), strict=True
        ):
            key = (window_start_ms(t, 5000), gen.pool.ips[i])
            late = watermark is not None and key[0] + 5000 <= watermark
            (fixes if late else finals)[key] += 1
        top = int(batch.event_ms[counted].max())
        newest = top if newest is None else max(newest, top)
    return finals, fixes, tally


def test_late_records_a_shipper_retried_are_seconds_to_a_minute_behind() -> None:
    gen = _gen(ips=50, late_fraction=0.02, jitter_seconds=2, late_behind_seconds=60)
    finals, fixes, tally = _simulate_job(gen, batches=120, size=1000, delay_ms=5000)
    ledger = tally.to_ledger()
    # Behind the watermark, not an hour back: the corrections are for windows of the last minute,
    # and never before the traffic began (a shipper retries only what it saw).
    assert 0 < len(fixes) and min(k[0] for k in fixes) >= START
    assert min(ledger.late_counts)[0] >= START
    # Records behind by less than the delay are on time: the ledger counts them as such.
    assert ledger.late < 0.02 * 120_000 and tally.on_time + tally.late == sum(
        finals.values()
    ) + sum(fixes.values())
    # late_corrections on (the default): final count + corrections = the ledger's total, exactly.
    for key in set(finals) | set(fixes) | set(ledger.counts) | set(ledger.late_counts):
        assert finals[key] + fixes[key] == ledger.counts[key] + ledger.late_counts[key], key
    # late_corrections off: a final count is the on-time count plus at most the late ones
    # the job still counted (never less: no record the ledger calls on time was late).
    for key in set(finals) | set(ledger.counts):
        assert ledger.counts[key] <= finals[key] <= ledger.counts[key] + ledger.late_counts[key]


def test_late_behind_must_be_positive_and_below_an_hour() -> None:
    with pytest.raises(ConfigError, match="--late-behind-seconds"):
        SynthSpec(late_behind_seconds=0).validate()
    with pytest.raises(ConfigError, match="--late-behind-seconds"):
        SynthSpec(late_behind_seconds=4000).validate()
