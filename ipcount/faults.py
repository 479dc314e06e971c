"""Fault injection for the chaos tests: IPCOUNT_FAULTS="point@batchId[/stop|/abort],..." makes
`fault_point` SIGKILL the job's process group (or SIGSTOP this process, or raise an abortable
Kafka error) at that point of that micro-batch (the sink's points: in the sink tasks).

On a Spark cluster the points run on executors: IPCOUNT_FAULTS_TARGET=executor (given to the
executors as spark.executorEnv.*) makes a point SIGKILL the executor it runs in (its JVM and its
Python workers) instead, once per arming, with the spec read from the file IPCOUNT_FAULTS_FILE
at every call (so the chaos runner arms and disarms a running job)."""

from __future__ import annotations

import logging
import os
import signal
import zlib
from pathlib import Path

from ipcount.errors import ConfigError, TransactionAbortedError

__all__ = [
    "ENV_VAR",
    "PGID_ENV_VAR",
    "LOG_ENV_VAR",
    "STATE_ENV_VAR",
    "FILE_ENV_VAR",
    "TARGET_ENV_VAR",
    "EXECUTOR",
    "EXECUTOR_CLASS",
    "POINTS",
    "parse_faults",
    "fault_point",
    "pin_process_group",
]

logger = logging.getLogger(__name__)

ENV_VAR = "IPCOUNT_FAULTS"
STOP_SUFFIX = "/stop"
ABORT_SUFFIX = "/abort"
# Where "/abort" faults record that they fired, so a restarted query in a new worker goes through.
STATE_ENV_VAR = "IPCOUNT_FAULTS_STATE"
# The process group to kill. Spark runs the sink's commit in a Python worker forked by the pyspark
# daemon, which makes its own process group: killing that group leaves the driver JVM alive.
# The driver pins its own group here before Spark starts, so a fault kills the whole job.
PGID_ENV_VAR = "IPCOUNT_FAULTS_PGID"
# Optional file a fault point appends its line to before the SIGKILL (the chaos runner's job log).
LOG_ENV_VAR = "IPCOUNT_FAULTS_LOG"
# A file holding the spec (IPCOUNT_FAULTS' syntax), read at every call: faults armed in a job that
# runs already (an executor's environment is fixed when the executor starts).
FILE_ENV_VAR = "IPCOUNT_FAULTS_FILE"
# What a kill fault kills: the job's process group (unset), or EXECUTOR: the Spark executor the
# point runs in (its JVM and the pyspark daemon's group), once per arming (IPCOUNT_FAULTS_STATE).
TARGET_ENV_VAR = "IPCOUNT_FAULTS_TARGET"
EXECUTOR = "executor"
# The main class of a Spark executor JVM (standalone, YARN and Kubernetes alike).
EXECUTOR_CLASS = "org.apache.spark.executor.CoarseGrainedExecutorBackend"
POINTS = frozenset(
    {
        # Records and the progress marker are produced inside the open transaction, not committed.
        "sink.before_commit",
        # The Kafka transaction is committed; Spark's commit log for the batch is not yet written.
        "sink.after_commit",
    }
)


def parse_faults(spec: str) -> frozenset[tuple[str, int]]:
    """Parse 'point@batchId,point@batchId' into a set of (point, batchId).

    Raises:
        ConfigError: an entry is malformed or names an unknown point (a typo would otherwise
            make a chaos test pass without ever injecting its fault).
    """
    faults: set[tuple[str, int]] = set()
    for raw in spec.split(","):
        entry = raw.strip()
        if not entry:
            continue
        entry = entry.removesuffix(STOP_SUFFIX).removesuffix(ABORT_SUFFIX)
        point, sep, batch = entry.partition("@")
        point = point.strip()
        if not sep or not batch.strip().lstrip("-").isdigit():
            raise ConfigError(
                f"{ENV_VAR}: entry {entry!r} must look like point@batchId, "
                "e.g. sink.before_commit@3"
            )
        if point not in POINTS:
            raise ConfigError(
                f"{ENV_VAR}: unknown fault point {point!r}; "
                f"known points: {', '.join(sorted(POINTS))}"
            )
        faults.add((point, int(batch)))
    return frozenset(faults)


_stopped: set[str] = set()


def pin_process_group() -> None:
    """When faults are configured, record this process's group as the one a fault kills.

    Call it in the driver before the SparkSession starts (the JVM and its Python workers inherit
    the environment). Does nothing without IPCOUNT_FAULTS or when a group is already pinned.
    """
    if os.environ.get(ENV_VAR) and not os.environ.get(PGID_ENV_VAR):
        os.environ[PGID_ENV_VAR] = str(os.getpgid(0))


def fault_point(name: str, batch_id: int) -> None:
    """SIGKILL the process group pinned in IPCOUNT_FAULTS_PGID (else this process's group) if
    IPCOUNT_FAULTS names (name, batch_id); otherwise do nothing.

    "point@batchId/stop" SIGSTOPs this process there instead (once per process and entry; with
    IPCOUNT_FAULTS_STATE, once per job for the point whatever the batch): a writer frozen in its
    open transaction (a long GC pause, a suspended VM), resumed by SIGCONT from outside.
    "point@batchId/abort" raises TransactionAbortedError there instead, once per job: an abortable
    Kafka error, which the job's restart strategy must survive (fired faults are remembered in the
    directory IPCOUNT_FAULTS_STATE when set, else per process).

    With IPCOUNT_FAULTS_TARGET=executor the spec comes from the file IPCOUNT_FAULTS_FILE (else
    IPCOUNT_FAULTS) and a kill fault kills the executor this runs in (see `_kill_executor`).

    The environment is read on every call (cheap), so a test can set it in a child's env only.
    """
    if os.environ.get(TARGET_ENV_VAR) == EXECUTOR:
        _executor_fault(name, batch_id)
        return
    spec = os.environ.get(ENV_VAR, "")
    if not spec:
        return
    if (name, batch_id) not in parse_faults(spec):
        return
    entries = {e.strip() for e in spec.split(",")}
    if f"{name}@{batch_id}{ABORT_SUFFIX}" in entries:
        _abort_once(name, batch_id)
        return
    entry = f"{name}@{batch_id}{STOP_SUFFIX}"
    if entry in entries:
        # Once per process (the retried batch then goes through); with a state directory once
        # per job for the point: a range of batches armed so that one of them stops, one does.
        if entry in _stopped or not _first_in_job(f"{name}{STOP_SUFFIX}"):
            return
        _stopped.add(entry)
        logger.error("fault injection: %s@%d: SIGSTOP to pid %d", name, batch_id, os.getpid())
        for handler in logging.getLogger().handlers:
            handler.flush()
        _record(f"fault injection: {name}@{batch_id}: SIGSTOP to pid {os.getpid()}\n")
        os.kill(os.getpid(), signal.SIGSTOP)
        logger.warning("fault injection: %s@%d: resumed", name, batch_id)
        return
    pinned = os.environ.get(PGID_ENV_VAR, "")
    group = int(pinned) if pinned.isdigit() else os.getpgid(0)
    logger.error("fault injection: %s@%d: SIGKILL to process group %d", name, batch_id, group)
    for handler in logging.getLogger().handlers:
        handler.flush()
    _record(f"fault injection: {name}@{batch_id}: SIGKILL to process group {group}\n")
    os.killpg(group, signal.SIGKILL)
    # Still alive: this process is outside the pinned group (a pyspark daemon worker, e.g. the
    # sink's commit, runs in the daemon's group). Without this it would carry on past the fault
    # point, e.g. commit the transaction a sink.before_commit crash must leave open. Kill its
    # own group too (the daemon and its workers: all part of the crashed job).
    os.killpg(os.getpgid(0), signal.SIGKILL)


def _armed_spec() -> str:
    """The spec in IPCOUNT_FAULTS_FILE (empty when it is missing), else IPCOUNT_FAULTS."""
    path = os.environ.get(FILE_ENV_VAR, "")
    if not path:
        return os.environ.get(ENV_VAR, "")
    try:
        return Path(path).read_text(encoding="utf-8").strip()
    except FileNotFoundError:
        return ""


def _executor_fault(name: str, batch_id: int) -> None:
    """A fault point inside an executor's task: SIGKILL of that executor, once per arming (the
    retried task, on another executor, must go through; so must the batch's other sink tasks)."""
    spec = _armed_spec()
    if not spec or (name, batch_id) not in parse_faults(spec):
        return
    # One key per point and armed spec: whichever task reaches the point first fires it.
    if not _first_in_job(f"{name}-{zlib.crc32(spec.encode()):08x}"):
        return
    where = _task_partition()
    executor = _executor_pid()
    if executor is None:
        logger.error(
            "fault injection: %s@%d: no Spark executor JVM (%s) among this process's parents: "
            "%s=%s is for Python workers of a cluster's executors",
            name,
            batch_id,
            EXECUTOR_CLASS,
            TARGET_ENV_VAR,
            EXECUTOR,
        )
        return
    group = os.getpgid(0)
    line = (
        f"fault injection: {name}@{batch_id}: SIGKILL to executor pid {executor} and process "
        f"group {group} (sink partition {where})"
    )
    logger.error("%s", line)
    for handler in logging.getLogger().handlers:
        handler.flush()
    _record(line + "\n")
    # The JVM first (its task must not report anything), then the pyspark daemon's group: the
    # daemon and its Python workers, this process among them.
    os.kill(executor, signal.SIGKILL)
    os.killpg(group, signal.SIGKILL)


def _task_partition() -> int | None:
    """The partition of the Spark task this runs in (None outside a task)."""
    try:
        from pyspark import TaskContext
    except ImportError:
        return None
    ctx = TaskContext.get()
    return None if ctx is None else ctx.partitionId()


def _executor_pid() -> int | None:
    """The Spark executor JVM among this process's ancestors (a Python worker's parent is the
    pyspark daemon, whose parent is the executor), or None."""
    pid = os.getppid()
    while pid > 1:
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
            stat = Path(f"/proc/{pid}/stat").read_text(encoding="ascii", errors="replace")
        except OSError:
            return None
        if EXECUTOR_CLASS.encode() in cmdline:
            return pid
        pid = int(stat.rsplit(")", 1)[-1].split()[1])
    return None


def _first_in_job(key: str) -> bool:
    """Whether `key` fires for the first time in this job: recorded in IPCOUNT_FAULTS_STATE when
    set (shared by the job's processes and its restarts), else always true."""
    state = os.environ.get(STATE_ENV_VAR, "")
    if not state:
        return True
    flag = os.path.join(state, key.replace("/", "_") + ".fired")
    try:
        fd = os.open(flag, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    except FileExistsError:
        return False
    with os.fdopen(fd, "w", encoding="utf-8") as fh:
        fh.write(str(os.getpid()))
    return True


def _abort_once(name: str, batch_id: int) -> None:
    key = f"{name}@{batch_id}{ABORT_SUFFIX}"
    if key in _stopped or not _first_in_job(key):
        return
    _stopped.add(key)
    logger.error("fault injection: %s@%d: an abortable Kafka error", name, batch_id)
    _record(f"fault injection: {name}@{batch_id}: abortable error in pid {os.getpid()}\n")
    raise TransactionAbortedError(
        f"fault injection at {name} of batch {batch_id}: the transaction was aborted"
    )


def _record(line: str) -> None:
    # A Python worker's stderr reaches the log through a JVM thread that the SIGKILL below kills
    # too, so the logged line is often lost: append it to IPCOUNT_FAULTS_LOG (if set) directly.
    path = os.environ.get(LOG_ENV_VAR, "")
    if not path:
        return
    try:
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            os.write(fd, line.encode())
        finally:
            os.close(fd)
    except OSError:
        logger.exception("cannot record the fault in %s", path)
