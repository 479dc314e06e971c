"""Garbage-collector handling for ipcount code running in Spark's Python workers (executors): the
long-lived heap frozen once, the collector paused while a batch of Kafka messages is held."""

from __future__ import annotations

import contextlib
import gc
from collections.abc import Iterator

__all__ = ["freeze_long_lived", "gc_paused"]

# Two costs measured in this job, both from CPython's cyclic collector rather than from real work:
# - Spark's reused Python worker calls a full `gc.collect()` after every task (pyspark/daemon.py).
#   With pyspark, pandas, pyarrow, confluent-kafka and fastavro imported that walks ~80k
#   long-lived objects, 40-120 ms on a small machine, and the worker takes no new task meanwhile:
#   every source read and sink write task of every micro-batch paid it (`freeze_long_lived`).
# - Every confluent-kafka `Message` is a GC-tracked object, so holding a batch of them triggers
#   collection after collection over that same heap: ~40% of the source read path's CPU
#   (`gc_paused`).

_frozen = False


def freeze_long_lived() -> None:
    """Once per process, move every object alive now out of the collector's sight (`gc.freeze()`).

    Called at the start of the first source read / sink write task in a Python worker, when the
    heap holds the imported modules. Frozen objects are still freed by reference counting; only
    frozen objects caught in a reference cycle are never reclaimed, so this runs once per process,
    not per task: the first task's own objects are the most it can keep (per-task freezing would
    keep each task's cyclic garbage, e.g. its unpickled functions, for ever). Afterwards Spark's
    per-task collection walks only what was created since.
    """
    global _frozen
    if not _frozen:
        _frozen = True
        gc.freeze()


@contextlib.contextmanager
def gc_paused() -> Iterator[None]:
    """Pause the cyclic collector for a stretch of code that creates no reference cycles.

    Refcounting still frees everything; the collector is back on (if it was) when the block ends,
    so it is never left off while control is in Spark's code.
    """
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()
