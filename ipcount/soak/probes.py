"""What a soak samples (in the `ipcount soak` process): a job's processes (memory, descriptors),
its checkpoint on disk, and the size of the progress topic. Linux /proc; no client library."""

from __future__ import annotations

import os
import time
from dataclasses import dataclass

from ipcount.childproc import session_processes
from ipcount.config import Settings

__all__ = ["ProcessFigures", "process_figures", "topic_records"]

_PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096


@dataclass(frozen=True)
class ProcessFigures:
    """Resident memory (bytes) and open descriptors of one job's processes.

    Memory is each process's proportional set size (see _rss).

    Attributes:
        driver_rss: the Python driver and its JVM (in local mode the executors run inside it).
        workers_rss: the Python workers (pyspark daemons and the workers they fork).
        fds: open file descriptors of all of them.
        processes: how many there are.
    """

    driver_rss: int = 0
    workers_rss: int = 0
    fds: int = 0
    processes: int = 0


def _rss(pid: int) -> int:
    """Proportional set size (PSS: shared pages split among their sharers, so the forked Python
    workers are not counted once per fork), or RSS where the kernel has no smaps_rollup."""
    try:
        with open(f"/proc/{pid}/smaps_rollup", encoding="ascii") as fh:
            for line in fh:
                if line.startswith("Pss:"):
                    return int(line.split()[1]) * 1024
    except FileNotFoundError:
        pass
    with open(f"/proc/{pid}/statm", encoding="ascii") as fh:
        return int(fh.read().split()[1]) * _PAGE


def _is_worker(pid: int) -> bool:
    with open(f"/proc/{pid}/cmdline", "rb") as fh:
        argv = fh.read().split(b"\0")
    return any(b"pyspark.daemon" in a or b"pyspark.worker" in a for a in argv) or (
        # Spark's Python runners start `python -m pyspark.<module>` or forked daemons.
        len(argv) > 2 and argv[1] == b"-m" and argv[2].startswith(b"pyspark.")
    )


def process_figures(session: int) -> ProcessFigures:
    """Figures of every live process in the job's session (its driver's PID)."""
    driver = workers = fds = count = 0
    for pid in session_processes(session):
        try:
            rss = _rss(pid)
            worker = _is_worker(pid)
            fds += len(os.listdir(f"/proc/{pid}/fd"))
        except OSError:  # gone while we looked
            continue
        count += 1
        if worker:
            workers += rss
        else:
            driver += rss
    return ProcessFigures(driver, workers, fds, count)


def topic_records(settings: Settings, topic: str, timeout: float = 10.0) -> tuple[int, int]:
    """(records, offsets) the topic holds now: the records a reader finds (after compaction) and
    the offset span they lie in (end minus start offset, summed over its partitions); (-1, -1)
    when the broker does not answer. Reads the whole topic: for small ones, like the progress
    topic, whose offsets keep growing while compaction keeps its records few."""
    from confluent_kafka import Consumer, TopicPartition

    from ipcount.errors import IpcountError
    from ipcount.kafka.topic_reader import TopicReader, consumer_conf

    base = settings.kafka.to_librdkafka("consumer")
    try:
        with TopicReader(base, topic, isolation="read_uncommitted", timeout=timeout) as reader:
            marks = reader.watermarks()
    except IpcountError:
        return -1, -1
    span = sum(max(0, high - low) for low, high in marks.values())
    consumer = Consumer(consumer_conf(base, "read_uncommitted", "ipcount-soak"))
    try:
        consumer.assign([TopicPartition(topic, p, low) for p, (low, _) in marks.items()])
        left = {p: high for p, (low, high) in marks.items() if high > low}
        records, deadline = 0, time.monotonic() + 6 * timeout
        while left and time.monotonic() < deadline:
            batch = consumer.consume(10_000, timeout=0.5)
            records += sum(1 for msg in batch if msg.error() is None)
            # The last offsets may be transaction markers, which no message shows: ask where
            # the consumer stands.
            for tp in consumer.position([TopicPartition(topic, p) for p in list(left)]):
                if tp.offset >= left[tp.partition]:
                    left.pop(tp.partition)
        return records, span
    finally:
        consumer.close()
