"""What a sink session reads from and writes to Spark's checkpoint: a batch's source end offsets and
watermark (the offset log), and the receipt that the broker acknowledged its commit."""

from __future__ import annotations

import logging
import time

from ipcount.checkpoint.offset_log import OffsetLog
from ipcount.checkpoint.receipts import Receipt, ReceiptLog
from ipcount.sink.marker import JsonValue

__all__ = ["batch_source_end", "write_receipt"]

logger = logging.getLogger(__name__)


def batch_source_end(checkpoint: str, batch_id: int) -> tuple[JsonValue, int | None]:
    """This batch's source end offset and watermark (batchWatermarkMs) from the checkpoint's
    offset log (None: unknown, or no checkpoint)."""
    if not checkpoint:
        return None, None
    try:
        log = OffsetLog(checkpoint)
        if batch_id not in log.batch_ids():
            return None, None
        meta, offsets = log.entry(batch_id)
    except Exception as exc:  # the marker is still written, without what the batch consumed
        logger.warning("batch %d: source offsets unknown (%s)", batch_id, exc)
        return None, None
    mark = meta.get("batchWatermarkMs")
    return (offsets[0] if len(offsets) == 1 else offsets), (
        int(mark) if isinstance(mark, int) else None
    )


def write_receipt(checkpoint: str, batch_id: int, records: int, source_end: JsonValue) -> None:
    """Record in the checkpoint that the broker acknowledged this batch's commit (nothing
    without a checkpoint)."""
    if not checkpoint:
        return
    try:
        receipts = ReceiptLog(checkpoint)
        if batch_id not in receipts.batch_ids():
            receipts.write(Receipt(batch_id, records, source_end, int(time.time() * 1000)))
    except OSError as exc:  # the commit stands; only the lost-commit check is weaker
        logger.warning("batch %d: could not write its commit receipt: %s", batch_id, exc)
