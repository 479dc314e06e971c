"""The sink's commit receipts, kept in the query's checkpoint (driver): what shows a commit the
broker acknowledged and then lost."""

from __future__ import annotations

import json
import logging
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ipcount.checkpoint.offset_log import local_path

__all__ = ["Receipt", "ReceiptLog", "KEEP"]

logger = logging.getLogger(__name__)

DIRECTORY = "ipcount-sink"
KEEP = 100


@dataclass(frozen=True)
class Receipt:
    """A batch the broker acknowledged as committed."""

    batch_id: int
    records: int
    source_end: Any
    committed_at_ms: int


class ReceiptLog:
    """`<checkpoint>/ipcount-sink`: one small JSON file per committed batch (local paths only;
    elsewhere receipts are not kept and a lost commit is not detected, see `enabled`).

    After Kafka acknowledges a batch's transaction, the sink writes `<batch>` ({"batchId",
    "records", "sourceEnd", "committedAtMs"}) before Spark writes its commit log. A receipt newer
    than the sink's last progress marker therefore means the broker acknowledged a commit and then
    lost it: the sink checks that when it starts, and stops instead of writing on over a hole. The
    newest `KEEP` receipts are kept.
    """

    def __init__(self, checkpoint: str) -> None:
        root = local_path(checkpoint)
        self.directory = None if root is None else Path(root) / DIRECTORY

    @property
    def enabled(self) -> bool:
        return self.directory is not None

    def write(self, receipt: Receipt) -> None:
        """Write atomically (tmp + rename), then drop receipts older than the newest KEEP."""
        if self.directory is None:
            return
        self.directory.mkdir(parents=True, exist_ok=True)
        body = {
            "batchId": receipt.batch_id,
            "records": receipt.records,
            "sourceEnd": receipt.source_end,
            "committedAtMs": receipt.committed_at_ms,
        }
        target = self.directory / str(receipt.batch_id)
        tmp = self.directory / f".{receipt.batch_id}.{os.getpid()}.tmp"
        tmp.write_text(json.dumps(body, separators=(",", ":")), encoding="utf-8")
        os.replace(tmp, target)
        for old in self.batch_ids()[:-KEEP]:
            (self.directory / str(old)).unlink(missing_ok=True)

    def batch_ids(self) -> list[int]:
        if self.directory is None or not self.directory.is_dir():
            return []
        return sorted(int(p.name) for p in self.directory.iterdir() if p.name.isdigit())

    def read(self, batch_id: int) -> Receipt:
        if self.directory is None:
            raise FileNotFoundError(f"no receipt of batch {batch_id}: receipts are not kept")
        body = json.loads((self.directory / str(batch_id)).read_text(encoding="utf-8"))
        return Receipt(
            int(body["batchId"]),
            int(body.get("records", 0)),
            body.get("sourceEnd"),
            int(body.get("committedAtMs", 0)),
        )

    def newer_than(self, batch_id: int | None) -> list[Receipt]:
        """Receipts of batches after `batch_id` (all of them for None), oldest first."""
        return [self.read(b) for b in self.batch_ids() if batch_id is None or b > batch_id]
