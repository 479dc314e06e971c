"""Data loss in the Kafka source: offsets deleted before they were read (driver and executors).
With failOnDataLoss=true it is decided once, by DataLossError (no restart brings records back);
with false the lost offsets are skipped, logged and counted."""

from __future__ import annotations

import logging
from typing import Any

from ipcount.errors import DataLossError
from ipcount.source.offsets import TopicPartitionKey

__all__ = ["check_data_loss", "lost_offsets"]

logger = logging.getLogger(__name__)

_HOW_TO_GO_ON = (
    "Records cannot come back by restarting; to skip exactly the lost offsets and go on, set "
    "job.fail_on_data_loss = false (IPCOUNT_JOB_FAIL_ON_DATA_LOSS=false; source option "
    "failOnDataLoss=false)"
)


def lost_offsets(fail_on_data_loss: bool, message: str) -> None:
    """Report lost offsets: raise DataLossError (failOnDataLoss=true), else log them.

    Raises:
        DataLossError: with `message` (topic, partition, offsets) and how to go on.
    """
    if fail_on_data_loss:
        raise DataLossError(f"data loss: {message}. {_HOW_TO_GO_ON}")
    logger.warning("data loss (failOnDataLoss=false, skipping): %s", message)


def check_data_loss(
    options: Any,
    offsets: Any,
    start: dict[TopicPartitionKey, int],
    parts: list[TopicPartitionKey],
    earliest: dict[TopicPartitionKey, int],
    latest: dict[TopicPartitionKey, int],
) -> dict[TopicPartitionKey, int]:
    """Where each partition's next batch starts (driver); reports lost offsets as
    failOnDataLoss says (`options`: SourceOptions; `offsets`: the KafkaOffsetReader)."""
    effective: dict[TopicPartitionKey, int] = {}
    for tp in sorted(set(start) - set(parts)):
        if tp[0] not in options.topics:
            logger.info("topic %s is no longer subscribed; dropping %s/%d", tp[0], *tp)
            continue
        lost_offsets(
            options.fail_on_data_loss,
            f"partition {tp[0]}/{tp[1]} no longer exists (was at offset {start[tp]})",
        )
    beyond = [tp for tp in parts if start.get(tp, 0) > latest[tp]]
    committed_end = offsets.offsets(beyond, "latest", read_committed=False) if beyond else {}
    for tp in parts:
        pos = start.get(tp, 0)
        if pos < earliest[tp]:
            what = "new partition" if tp not in start else "partition"
            lost_offsets(
                options.fail_on_data_loss,
                f"{what} {tp[0]}/{tp[1]}: offsets {pos}-{earliest[tp] - 1} were deleted before "
                f"they were read (log now starts at {earliest[tp]})",
            )
            pos = earliest[tp]
        elif pos > latest[tp] and pos > committed_end[tp]:
            lost_offsets(
                options.fail_on_data_loss,
                f"partition {tp[0]}/{tp[1]}: offset {pos} is beyond the end of the log "
                f"({committed_end[tp]}); was the topic deleted and re-created?",
            )
            pos = latest[tp]
        # Else pos may still exceed the last stable offset, held back by an open transaction:
        # no data loss, the partition just waits at pos.
        effective[tp] = pos
    return effective
