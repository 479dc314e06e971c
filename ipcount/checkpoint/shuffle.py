"""How many shuffle partitions a checkpoint fixed (driver): Spark keeps the number a query first
ran with in every offset log entry and uses it on every restart, whatever the settings say."""

from __future__ import annotations

import logging

from ipcount.checkpoint.offset_log import OffsetLog
from ipcount.errors import ConfigError

__all__ = ["SHUFFLE_PARTITIONS_CONF", "checkpoint_shuffle_partitions", "check_shuffle_partitions"]

logger = logging.getLogger(__name__)

SHUFFLE_PARTITIONS_CONF = "spark.sql.shuffle.partitions"


def checkpoint_shuffle_partitions(checkpoint: str) -> int | None:
    """The shuffle partitions recorded in the checkpoint's newest offset log entry (None: no
    entry yet, or one Python cannot read)."""
    try:
        log = OffsetLog(checkpoint)
        planned = log.batch_ids()
        if not planned:
            return None
        meta, _ = log.entry(planned[-1])
    except Exception as exc:  # an unreadable checkpoint is reported by the checks that need it
        logger.info("cannot read the offset log of %s (%s)", checkpoint, exc)
        return None
    conf = meta.get("conf")
    value = conf.get(SHUFFLE_PARTITIONS_CONF) if isinstance(conf, dict) else None
    return int(value) if isinstance(value, str) and value.isdigit() else None


def check_shuffle_partitions(checkpoint: str, configured: int) -> int:
    """The shuffle partitions the query runs with: the checkpoint's, which must be `configured`
    (spark.shuffle_partitions); a checkpoint without an entry takes `configured`.

    Raises:
        ConfigError: the setting differs from what the checkpoint fixed.
    """
    fixed = checkpoint_shuffle_partitions(checkpoint)
    if fixed is not None and fixed != configured:
        raise ConfigError(
            f"spark.shuffle_partitions is {configured}, but checkpoint {checkpoint} was started "
            f"with {fixed}: Spark keeps a checkpoint's number for good (its state and its sink "
            f"tasks are partitioned by it). Set spark.shuffle_partitions = {fixed}, or start "
            "with `--new-query` on a new checkpoint to change it"
        )
    return configured
