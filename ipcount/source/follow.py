"""The dead-letter query follows the counting query's batches (driver only): it reads what that
query has planned, cut at that query's batch ends, and records those batches' times in its own
offsets, so both queries give each record one verdict, through replays too."""

from __future__ import annotations

from ipcount.source.offsets import SourceOffset, TopicPartitionKey, Verdicts, follow_batches

__all__ = ["CountsFollower"]

# The most batches of the counting query one dead-letter batch follows (its tasks are cut at their
# boundaries, so this bounds the tasks of a dead-letter query catching up).
MAX_FOLLOWED_BATCHES = 16


class CountsFollower:
    """Reads the counting query's offset log (`checkpoint`), each entry once."""

    def __init__(self, checkpoint: str) -> None:
        self.checkpoint = checkpoint
        # batch id -> (end offsets, batch time ms)
        self._batches: dict[int, tuple[dict[TopicPartitionKey, int], int]] = {}

    def follow(
        self, start: dict[TopicPartitionKey, int], end: dict[TopicPartitionKey, int]
    ) -> tuple[dict[TopicPartitionKey, int], Verdicts]:
        """(the end this batch may read up to, the verdicts its records get)."""
        from ipcount.checkpoint.offset_log import OffsetLog

        log = OffsetLog(self.checkpoint)
        ids = log.batch_ids()
        kept = set(ids)
        self._batches = {i: b for i, b in self._batches.items() if i in kept}
        for batch_id in ids:
            if batch_id not in self._batches:
                meta, offsets = log.entry(batch_id)
                ends = SourceOffset.from_json(offsets[0]).offsets if offsets else {}
                self._batches[batch_id] = (ends, int(meta.get("batchTimestampMs", 0)))
        batches = [self._batches[i] for i in ids]
        return follow_batches(start, end, batches, MAX_FOLLOWED_BATCHES)
