"""The sink inside a real Spark streaming query: commit, a write() failure (abort), and the re-run
of a batch whose Kafka commit happened but whose Spark commit log entry was lost."""

from __future__ import annotations

import datetime as dt
import json
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from ipcount.config import Settings
from ipcount.formats.avro import IpCount, SingleObjectCodec
from ipcount.kafka.topic_reader import TopicReader
from ipcount.kafka.topics import ensure_topics
from ipcount.sink.writer import sink_options
from ipcount.verify.compare import compare
from ipcount.verify.ledger import Ledger

W = 5000
T0 = 1_700_000_000_000  # a multiple of 5000 ms


def _rows(first_ip: int, n_ips: int, window: int) -> list[dict[str, Any]]:
    """Access events of IPs 192.0.2.<first_ip...> in the 5 s window number `window` after T0."""
    rows = []
    for i in range(first_ip, first_ip + n_ips):
        for k in range(1 + i % 3):
            ms = T0 + window * W + (k * 397 + i * 31) % W
            rows.append(
                {
                    "ts": dt.datetime.fromtimestamp(ms / 1000, tz=dt.UTC).isoformat(),
                    "ip": f"192.0.2.{i}",
                }
            )
    return rows


def _write(path: Path, rows: list[dict[str, Any]]) -> None:
    tmp = path.with_name("." + path.name)
    tmp.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    tmp.rename(path)


def _ledger(*row_sets: list[dict[str, Any]]) -> Ledger:
    ledger = Ledger(window_ms=W)
    for rows in row_sets:
        for r in rows:
            ledger.add(int(dt.datetime.fromisoformat(r["ts"]).timestamp() * 1000), r["ip"])
    return ledger


def _read(settings: Settings, isolation: str) -> list[tuple[str, IpCount | None]]:
    codec = SingleObjectCodec()
    conf = settings.kafka.to_librdkafka("consumer")
    with TopicReader(conf, settings.topics.sink, isolation=isolation) as reader:
        return [(r.where, codec.decode(r.value)) for r in reader.read_to_end(20)]  # type: ignore[arg-type]


def _ends(settings: Settings) -> tuple[int, int]:
    conf = settings.kafka.to_librdkafka("consumer")
    totals = []
    for topic in (settings.topics.sink, settings.topics.progress):
        with TopicReader(conf, topic) as reader:
            totals.append(sum(high for _, high in reader.watermarks().values()))
    return totals[0], totals[1]


def _run(
    spark: Any, source: Path, checkpoint: Path, options: dict[str, str], break_ip: bool = False
) -> Any:
    """One availableNow run of: JSON files -> watermark -> 5 s window count per IP (append) ->
    ipcount-kafka-txn. `break_ip` nulls the ip after the aggregation, so write() fails."""
    from pyspark.sql import functions as F

    ip = F.when(F.lit(break_ip), F.lit(None).cast("string")).otherwise(F.col("ip"))

    counts = (
        spark.readStream.schema("ts timestamp, ip string")
        .json(str(source))
        .withWatermark("ts", "0 seconds")
        .groupBy(F.window("ts", "5 seconds"), "ip")
        .count()
        .select(
            F.col("window.start").alias("window_start"),
            F.col("window.end").alias("window_end"),
            ip.alias("ip"),
            "count",
        )
    )
    query = (
        counts.writeStream.format("ipcount-kafka-txn")
        .options(**options)
        .outputMode("append")
        .option("checkpointLocation", str(checkpoint))
        .trigger(availableNow=True)
        .start()
    )
    try:
        query.awaitTermination(120)
    except Exception as exc:  # the failing run: StreamingQueryException
        return exc
    finally:
        query.stop()
    return query.exception()


def test_streaming_query_commit_abort_and_replay(
    spark: Any, make_settings: Callable[..., Settings], tmp_path: Path
) -> None:
    settings = make_settings()
    ensure_topics(settings)
    source, checkpoint = tmp_path / "in", tmp_path / "ckpt"
    source.mkdir()
    options = sink_options(settings, f"spark-{uuid.uuid4().hex[:8]}")
    win_a, win_b, win_c = _rows(0, 20, window=0), _rows(20, 15, window=1), _rows(40, 5, window=2)
    _write(source / "part-0.json", win_a)
    _write(source / "part-1.json", win_b)

    # Run 1: one batch reads both files; the next (no-data) batch emits window A, which the
    # watermark (max event time, in window B) has passed.
    assert _run(spark, source, checkpoint, options) is None
    report = compare(_read(settings, "read_committed"), _ledger(win_a))
    assert report.summary().endswith("results=20 missing=0 duplicates=0 wrong=0 exact=true")
    ends = _ends(settings)

    # Lose Spark's commit log entry of the batch that emitted window A, as a crash between the
    # Kafka commit and Spark's commit log would: every restart runs that batch again.
    last = max(int(p.name) for p in (checkpoint / "commits").iterdir() if p.name.isdigit())
    for name in (str(last), f".{last}.crc"):
        (checkpoint / "commits" / name).unlink(missing_ok=True)  # no .crc on a raw local FS

    # Run 2: the re-run batch fails inside write() (null ip): Spark aborts it, the query stops.
    error = _run(spark, source, checkpoint, options, break_ip=True)
    assert error is not None and "IpCount.ip must be a string" in str(error)
    assert not (checkpoint / "commits" / str(last)).exists()
    # Records are produced only in commit(): the failed batch left nothing, not even aborted.
    assert _ends(settings) == ends

    # Run 3: the re-run batch now reaches commit(), which skips it (the progress marker has it);
    # then new events close window B, which is committed once (window C stays open).
    _write(source / "part-2.json", win_c)
    assert _run(spark, source, checkpoint, options) is None
    assert (checkpoint / "commits" / str(last)).exists()
    ledger = _ledger(win_a, win_b)
    committed = _read(settings, "read_committed")
    report = compare(committed, ledger)
    assert report.exact and report.results == 35, report.summary()
    got = {r.ip: r for _, r in committed if r is not None}
    assert got["192.0.2.20"].window_start == T0 + W and got["192.0.2.20"].window_end == T0 + 2 * W
    # Even read_uncommitted sees window A once: the replay wrote nothing.
    report = compare(_read(settings, "read_uncommitted"), ledger, "read_uncommitted")
    assert report.exact, report.summary()


@pytest.fixture(autouse=True)
def _no_faults(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("IPCOUNT_FAULTS", raising=False)
