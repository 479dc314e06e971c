"""Offset arithmetic of the Kafka source (no broker): offset JSON, limits, heartbeats
(the read tasks' ranges: source.task_plan).

Runs on the driver (planning) and on executors (partition objects); all of it is picklable data.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ipcount.errors import SourceError

__all__ = [
    "EARLIEST",
    "LATEST",
    "TopicPartitionKey",
    "Heartbeat",
    "SourceOffset",
    "OffsetRange",
    "parse_starting_offsets",
    "spread_limit",
    "next_heartbeat",
    "flush_heartbeat",
    "Verdicts",
    "follow_batches",
    "lag_report",
]

# (topic, partition)
TopicPartitionKey = tuple[str, int]

# Per partition, the batches of the counting query that read it: (end offset, batch time ms),
# ascending. A record at offset o was judged by the first batch whose end is above o.
Verdicts = dict[TopicPartitionKey, tuple[tuple[int, int], ...]]

# Spark's Kafka source uses these in startingOffsets JSON for "earliest" / "latest".
EARLIEST = -2
LATEST = -1


@dataclass(frozen=True)
class Heartbeat:
    """A heartbeat carried in an offset: the `seq`-th since the last record, at event time `ts`.

    `base` is the latest record event time (epoch ms) the heartbeat advances from; it is kept in the
    offset so a restarted driver continues from it without asking Kafka again.
    """

    seq: int
    ts: int
    base: int

    def to_json(self) -> dict[str, int]:
        return {"seq": self.seq, "ts": self.ts, "base": self.base}


@dataclass(frozen=True)
class SourceOffset:
    """The source's offset in Spark's checkpoint: next offset per topic partition, plus a heartbeat.

    JSON: {"offsets": {"topic": {"0": 42, "1": 17}}, "heartbeat": {"seq": 1, "ts": .., "base": ..}}
    ("heartbeat" only when the batch ending here emits one; "verdicts", {"topic": {"0": [[end,
    batch_ms], ..]}}, only in the dead-letter query: the counting query's batches this batch's
    records were judged by). Keys are written in a fixed order, so equal offsets always serialize
    to equal JSON (Spark compares offsets as strings).
    """

    offsets: dict[TopicPartitionKey, int]
    heartbeat: Heartbeat | None = None
    verdicts: Verdicts | None = None

    def to_json(self) -> dict[str, Any]:
        by_topic: dict[str, dict[str, int]] = {}
        for topic, partition in sorted(self.offsets):
            by_topic.setdefault(topic, {})[str(partition)] = int(self.offsets[(topic, partition)])
        out: dict[str, Any] = {"offsets": by_topic}
        if self.heartbeat is not None:
            out["heartbeat"] = self.heartbeat.to_json()
        if self.verdicts is not None:
            judged: dict[str, dict[str, list[list[int]]]] = {}
            for topic, partition in sorted(self.verdicts):
                judged.setdefault(topic, {})[str(partition)] = [
                    [int(end), int(ts)] for end, ts in self.verdicts[(topic, partition)]
                ]
            out["verdicts"] = judged
        return out

    @classmethod
    def from_json(cls, obj: Any) -> SourceOffset:
        """Parse an offset written by `to_json` (as Spark hands it back from its checkpoint).

        Raises:
            SourceError: the offset is not in this source's format (another source's checkpoint).
        """
        if isinstance(obj, str):
            obj = json.loads(obj)
        try:
            offsets = {
                (str(topic), int(partition)): int(offset)
                for topic, parts in obj["offsets"].items()
                for partition, offset in parts.items()
            }
            hb = obj.get("heartbeat")
            heartbeat = Heartbeat(int(hb["seq"]), int(hb["ts"]), int(hb["base"])) if hb else None
            judged = obj.get("verdicts")
            verdicts = (
                {
                    (str(topic), int(partition)): tuple((int(e), int(t)) for e, t in bounds)
                    for topic, parts in judged.items()
                    for partition, bounds in parts.items()
                }
                if judged is not None
                else None
            )
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise SourceError(
                f"checkpointed offset {obj!r} is not an ipcount-kafka offset "
                "(was the checkpoint written by another source? use a new checkpointLocation)"
            ) from exc
        return cls(offsets, heartbeat, verdicts)


@dataclass(frozen=True)
class OffsetRange:
    """Offsets [start, end) of one topic partition, read by one Spark task."""

    topic: str
    partition: int
    start: int
    end: int

    @property
    def size(self) -> int:
        return self.end - self.start


def parse_starting_offsets(text: str, topics: Iterable[str]) -> str | dict[TopicPartitionKey, int]:
    """Parse the startingOffsets option: 'earliest', 'latest', or Spark's JSON form.

    JSON looks like {"topic": {"0": 23, "1": -2}}; -2 means earliest and -1 latest.

    Raises:
        SourceError: naming startingOffsets and what is wrong with it.
    """
    value = text.strip()
    if value.lower() in ("earliest", "latest"):
        return value.lower()
    try:
        obj = json.loads(value)
    except json.JSONDecodeError:
        raise SourceError(
            f"startingOffsets={text!r} must be 'earliest', 'latest' or JSON like "
            '{"topic": {"0": 23, "1": -2}}'
        ) from None
    if not isinstance(obj, dict) or not obj:
        raise SourceError(f"startingOffsets JSON must be an object of topics, got {text!r}")
    wanted = set(topics)
    result: dict[TopicPartitionKey, int] = {}
    for topic, parts in obj.items():
        if topic not in wanted:
            raise SourceError(
                f"startingOffsets names topic {topic!r}, which is not in subscribe={sorted(wanted)}"
            )
        if not isinstance(parts, dict):
            raise SourceError(
                f"startingOffsets for topic {topic!r} must be an object of partitions"
            )
        for partition, offset in parts.items():
            try:
                p, o = int(partition), int(offset)
            except (TypeError, ValueError):
                raise SourceError(
                    f"startingOffsets {topic}/{partition}={offset!r}: "
                    "partition and offset must be integers"
                ) from None
            if p < 0 or o < EARLIEST:
                raise SourceError(
                    f"startingOffsets {topic}/{p}={o}: "
                    "use an offset >= 0, -2 (earliest) or -1 (latest)"
                )
            result[(topic, p)] = o
    return result


def spread_limit(
    start: Mapping[TopicPartitionKey, int], latest: Mapping[TopicPartitionKey, int], max_rows: int
) -> dict[TopicPartitionKey, int]:
    """End offsets that admit at most `max_rows` offsets, shared by the partitions' lag.

    Each partition gets floor(max_rows * lag / total_lag); the remaining offsets go one each to the
    partitions with the largest fractional shares (ties in topic/partition order), so exactly
    min(max_rows, total_lag) offsets are admitted and no partition gets more than its lag.
    Partitions missing from `start` are new and start at 0.
    """
    if max_rows <= 0:
        raise ValueError("max_rows must be positive")
    keys = sorted(latest)
    lags = {tp: max(0, latest[tp] - start.get(tp, 0)) for tp in keys}
    total = sum(lags.values())
    if total <= max_rows:
        return {tp: max(latest[tp], start.get(tp, 0)) for tp in keys}
    share: dict[TopicPartitionKey, int] = {}
    fraction: dict[TopicPartitionKey, int] = {}
    for tp in keys:
        share[tp], fraction[tp] = divmod(max_rows * lags[tp], total)
    remainder = max_rows - sum(share.values())
    for tp in sorted(keys, key=lambda k: -fraction[k])[:remainder]:
        share[tp] += 1
    return {tp: start.get(tp, 0) + share[tp] for tp in keys}


def next_heartbeat(
    prev: Heartbeat | None,
    base: int,
    idle_ms: int,
    *,
    idle_timeout_ms: int,
    max_advance_ms: int,
    interval_ms: int,
) -> Heartbeat | None:
    """The heartbeat to emit after `idle_ms` of wall-clock idleness, or None.

    Its event time is `base` (latest record event time) + idle time, capped at
    base + max_advance_ms.
    A new heartbeat is only emitted once idle_ms reaches idle_timeout_ms, when it advances at least
    interval_ms past the previous one (or reaches the cap), and never beyond the cap: after that
    every idle trigger would cost a micro-batch for nothing.
    """
    if idle_timeout_ms <= 0 or idle_ms < idle_timeout_ms:
        return None
    cap = base + max_advance_ms
    ts = min(base + idle_ms, cap)
    last = max(prev.ts, base) if prev is not None else base
    if ts <= last or (ts < last + interval_ms and ts < cap):
        return None
    return Heartbeat(seq=prev.seq + 1 if prev is not None else 1, ts=ts, base=base)


def flush_heartbeat(prev: Heartbeat | None, base: int, max_advance_ms: int) -> Heartbeat | None:
    """The final heartbeats of a Trigger.AvailableNow run, or None once both were sent.

    `max_advance_ms` 0 ends the run at the newest event time `base` (the watermark moves no further
    than the data moved it); heartbeatMaxAdvanceMs closes every window.
    Two are needed. The first, at base + max_advance_ms, moves the watermark (the source attaches
    it to the batch that reads the run's last records), but Spark applies a new watermark only
    from the next batch on and AvailableNow runs no extra no-data batch for it. The second, 1 ms
    later, is that next batch: it evicts and emits every window the first closed.
    """
    cap = base + max_advance_ms
    if prev is None or prev.ts < cap:
        return Heartbeat(seq=prev.seq + 1 if prev is not None else 1, ts=cap, base=base)
    if prev.ts == cap:
        return Heartbeat(seq=prev.seq + 1, ts=cap + 1, base=base)
    return None


def follow_batches(
    start: Mapping[TopicPartitionKey, int],
    end: Mapping[TopicPartitionKey, int],
    batches: Sequence[tuple[Mapping[TopicPartitionKey, int], int]],
    max_batches: int,
) -> tuple[dict[TopicPartitionKey, int], Verdicts]:
    """The end offsets a follower (the dead-letter query) may read up to, and the verdicts its
    records get: those of the counting query's `batches` ((end offsets, batch time ms), in batch
    order) that read them.

    Only records the counting query has planned are judged: each partition's end is capped at
    the end of the last batch taken, and at most `max_batches` batches past `start` are taken.
    """
    ahead = [
        (ends, ts) for ends, ts in batches if any(ends.get(tp, 0) > start.get(tp, 0) for tp in end)
    ][:max_batches]
    capped: dict[TopicPartitionKey, int] = {}
    verdicts: Verdicts = {}
    for tp in sorted(end):
        pos, stop = start.get(tp, 0), end[tp]
        bounds: list[tuple[int, int]] = []
        for ends, ts in ahead:
            if pos >= stop:
                break
            b_end = ends.get(tp, 0)
            if b_end <= pos:
                continue  # this batch read nothing of tp past pos
            pos = min(b_end, stop)
            bounds.append((pos, ts))
        capped[tp] = max(pos, start.get(tp, 0)) if bounds else start.get(tp, 0)
        if bounds:
            verdicts[tp] = tuple(bounds)
    return capped, verdicts


def lag_report(
    latest: dict[TopicPartitionKey, int], end: dict[TopicPartitionKey, int]
) -> dict[str, Any]:
    """reportLatestOffset: the log end per partition and the lag left after the planned batch."""
    offsets: dict[str, dict[str, int]] = {}
    lag: dict[str, dict[str, int]] = {}
    for topic, partition in sorted(latest):
        offsets.setdefault(topic, {})[str(partition)] = latest[(topic, partition)]
        behind = max(0, latest[(topic, partition)] - end.get((topic, partition), 0))
        lag.setdefault(topic, {})[str(partition)] = behind
    return {"offsets": offsets, "lag": lag, "totalLag": sum(sum(p.values()) for p in lag.values())}
