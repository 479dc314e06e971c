"""Memory and CPU of the benchmarked job's process tree, sampled with psutil in a thread of the
bench process: peak RSS and CPU seconds by role (driver JVM, Python driver, Python workers), and
the CPU the benchmark's own broker used meanwhile (it shares the machine's cores with the job),
and a timeline of the machine's busy CPU, from which the cores busy while batches ran are taken.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import NamedTuple

import psutil

__all__ = ["CoresBusy", "CpuSample", "MemoryPeaks", "MemorySampler", "cores_busy", "fmt_mb"]

_SAMPLE_SECONDS = 0.5


@dataclass
class MemoryPeaks:
    """Peak RSS (bytes) of the job's process tree, by role, from periodic samples."""

    # The `java` processes: the driver's JVM, and in local mode the executors inside it.
    jvm: int = 0
    # The Python driver (the job process itself: the root of the tree).
    driver: int = 0
    # Spark's Python workers, summed over the most seen at once (forked workers share pages, so
    # this is an upper bound), and how many there were at most.
    workers: int = 0
    max_workers: int = 0
    # The peak of the three's sum at one sample.
    total: int = 0
    # The largest single Python worker: a sink task's holds its share of a batch's results.
    one_worker: int = 0
    samples: int = 0
    # CPU seconds (user + system) used by each role over the job process's life, from the last
    # sample of every process seen: robust to other load on the machine, unlike wall time.
    cpu_jvm: float = 0.0
    cpu_driver: float = 0.0
    cpu_workers: float = 0.0
    # CPU seconds the local broker used while the job ran (None: not sampled, e.g. --bootstrap).
    cpu_broker: float | None = None
    # The machine's busy CPU and the broker's, at every sample (see cores_busy).
    timeline: list[CpuSample] = field(default_factory=list)
    machine_cores: int = field(default_factory=lambda: os.cpu_count() or 1)


class CpuSample(NamedTuple):
    """Cumulative CPU seconds at one instant (epoch s): the whole machine's busy time (every
    state but idle and iowait, all cores) and the local broker's (None: not sampled)."""

    at: float
    machine_s: float
    broker_s: float | None


@dataclass(frozen=True)
class CoresBusy:
    """Mean cores busy over some spans: the whole machine, the broker's share (None: not
    sampled), and the rest (the job, plus whatever else runs: the bench's own sampling)."""

    machine: float
    broker: float | None
    seconds: float

    @property
    def job(self) -> float:
        return self.machine - (self.broker or 0.0)


def cores_busy(
    timeline: Sequence[CpuSample], spans: Sequence[tuple[float, float]]
) -> CoresBusy | None:
    """Mean cores busy over the spans (epoch s), the counters interpolated between samples;
    None when a span lies outside the samples or there is no time at all."""
    machine = broker = seconds = 0.0
    with_broker = True
    for begin, end in spans:
        a, b = _at(timeline, begin), _at(timeline, end)
        if a is None or b is None or end <= begin:
            return None
        machine += b[0] - a[0]
        seconds += end - begin
        if a[1] is None or b[1] is None:
            with_broker = False
        else:
            broker += b[1] - a[1]
    if seconds <= 0:
        return None
    return CoresBusy(machine / seconds, broker / seconds if with_broker else None, seconds)


def _at(timeline: Sequence[CpuSample], t: float) -> tuple[float, float | None] | None:
    """The counters at t, interpolated between the samples around it."""
    for x, y in zip(timeline, timeline[1:], strict=False):
        if x.at <= t <= y.at:
            f = (t - x.at) / (y.at - x.at) if y.at > x.at else 0.0
            machine = x.machine_s + f * (y.machine_s - x.machine_s)
            if x.broker_s is None or y.broker_s is None:
                return machine, None
            return machine, x.broker_s + f * (y.broker_s - x.broker_s)
    return None


class MemorySampler:
    """Samples RSS of a process and its descendants in a thread: the root is the Python driver,
    `java` processes are the driver JVM (local mode: executors too), other Pythons are Spark's
    Python workers (summed; forked workers share pages, so the sum is an upper bound)."""

    def __init__(
        self, pid: int, interval: float = _SAMPLE_SECONDS, broker_pid: int | None = None
    ) -> None:
        self.pid = pid
        self.interval = interval
        self.peaks = MemoryPeaks()
        self._cpu: dict[int, tuple[str, float]] = {}
        self._broker = _Counter(broker_pid)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="bench-rss", daemon=True)

    def __enter__(self) -> MemorySampler:
        self._broker.read()
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        if not self._stop.is_set():
            self._stop.set()
            self._thread.join(5)
            self.peaks.cpu_broker = self._broker.read()
            totals = {"jvm": 0.0, "driver": 0.0, "workers": 0.0}
            for role, cpu in self._cpu.values():
                totals[role] += cpu
            p = self.peaks
            p.cpu_jvm, p.cpu_driver, p.cpu_workers = (
                totals["jvm"],
                totals["driver"],
                totals["workers"],
            )

    def sample(self) -> None:
        self._sample_machine()
        try:
            root = psutil.Process(self.pid)
            procs = [root, *root.children(recursive=True)]
        except psutil.Error:
            return
        jvm = driver = workers = n_workers = one_worker = 0
        for proc in procs:
            try:
                with proc.oneshot():
                    rss = proc.memory_info().rss
                    name = proc.name()
                    times = proc.cpu_times()
            except psutil.Error:
                continue
            if proc.pid == self.pid:
                driver += rss
                role = "driver"
            elif name.startswith("java"):
                jvm += rss
                role = "jvm"
            elif name.startswith("python"):
                workers += rss
                n_workers += 1
                one_worker = max(one_worker, rss)
                role = "workers"
            else:
                continue
            self._cpu[proc.pid] = (role, times.user + times.system)
        p = self.peaks
        p.jvm, p.driver = max(p.jvm, jvm), max(p.driver, driver)
        p.workers, p.max_workers = max(p.workers, workers), max(p.max_workers, n_workers)
        p.total = max(p.total, jvm + driver + workers)
        p.one_worker = max(p.one_worker, one_worker)
        p.samples += 1

    def _sample_machine(self) -> None:
        t = psutil.cpu_times()
        busy = sum(t) - t.idle - getattr(t, "iowait", 0.0)
        # guest time is already counted in user time (Linux); not twice.
        busy -= getattr(t, "guest", 0.0) + getattr(t, "guest_nice", 0.0)
        self.peaks.timeline.append(CpuSample(time.time(), busy, self._broker.read()))

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            self.sample()


class _Counter:
    """CPU seconds of one process since the first read (None when there is no such process)."""

    def __init__(self, pid: int | None) -> None:
        self._proc: psutil.Process | None = None
        self._first: float | None = None
        if pid is not None:
            try:
                self._proc = psutil.Process(pid)
            except psutil.Error:
                self._proc = None

    def read(self) -> float | None:
        if self._proc is None:
            return None
        try:
            times = self._proc.cpu_times()
        except psutil.Error:
            return None
        now = times.user + times.system
        if self._first is None:
            self._first = now
        return now - self._first


def fmt_mb(n: int) -> str:
    """Bytes as whole MiB, for the peak_rss_MB lines."""
    return f"{n / 2**20:.0f}"
