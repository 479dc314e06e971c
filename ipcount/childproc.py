"""Child processes started one way: `spawn` (own session, output to a log file), stop by PID
(SIGTERM, then SIGKILL to the process group), reap; plus the /proc look-ups they need."""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import signal
import subprocess
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import IO

__all__ = [
    "KILL_EXIT_CODES",
    "Child",
    "spawn",
    "stop_pid",
    "kill_pid",
    "pid_alive",
    "process_identity",
    "session_processes",
]

logger = logging.getLogger(__name__)

# How a SIGKILL shows as an exit status: -9 from Popen, or 137 through a shell.
KILL_EXIT_CODES = (-signal.SIGKILL, 128 + signal.SIGKILL)


def pid_alive(pid: int) -> bool:
    """Whether `pid` is a live process (a zombie counts as gone)."""
    try:
        os.kill(pid, 0)
    except OSError as exc:
        return exc.errno == errno.EPERM
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii") as fh:
            return fh.read().split(")")[-1].split()[0] != "Z"
    except OSError:
        return True


def process_identity(pid: int) -> dict[str, str] | None:
    """What tells process `pid` apart from a later one with the same PID: its start time (clock
    ticks after boot, /proc/PID/stat field 22) and the boot id. None without such a process or
    without /proc."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as fh:
            # Fields after the command name, which may hold spaces and parentheses: field 3 on.
            fields = fh.read().rsplit(")", 1)[1].split()
        with open("/proc/sys/kernel/random/boot_id", encoding="ascii") as fh:
            boot_id = fh.read().strip()
        return {"start_ticks": fields[22 - 3], "boot_id": boot_id}
    except (OSError, IndexError):
        return None


def session_processes(sid: int) -> list[int]:
    """PIDs of live processes in session `sid` (Linux /proc; empty elsewhere)."""
    pids = []
    for name in os.listdir("/proc") if os.path.isdir("/proc") else ():
        if not name.isdigit():
            continue
        pid = int(name)
        try:
            if os.getsid(pid) != sid:
                continue
            with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as fh:
                if fh.read().rsplit(")", 1)[-1].split()[0] == "Z":
                    continue
        except (OSError, IndexError):
            continue
        pids.append(pid)
    return pids


def _signal(pid: int, sig: int, *, group: bool = False) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        if group:
            os.killpg(pid, sig)
        else:
            os.kill(pid, sig)


class Child:
    """A process started by `spawn`: its PID, log file and exit status; stop, kill and reap.

    With `own_session` it leads its own session and process group, so `kill()` ends the group
    (the child and whatever it started, e.g. a JVM) and a Ctrl-C in the terminal does not reach
    it; without, `kill()` signals the child alone.
    """

    def __init__(
        self, proc: subprocess.Popen[bytes], log: Path | None, name: str, own_session: bool
    ) -> None:
        self.proc = proc
        self.pid = proc.pid
        self.log = log
        self.name = name
        self.own_session = own_session

    def __repr__(self) -> str:
        return f"Child({self.name!r}, pid={self.pid}, log={str(self.log)!r})"

    def poll(self) -> int | None:
        """Its exit status, or None while it runs."""
        return self.proc.poll()

    @property
    def alive(self) -> bool:
        return self.proc.poll() is None

    @property
    def returncode(self) -> int | None:
        return self.proc.poll()

    def wait(self, timeout: float | None = None) -> int | None:
        """Wait up to `timeout` seconds (None: for ever) for it to exit; its status or None."""
        try:
            return self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            return None

    def send_signal(self, sig: int) -> None:
        """Send `sig` to the child alone (not its group), if it still runs."""
        if self.proc.poll() is None:
            _signal(self.pid, sig)

    def signal_group(self, sig: int) -> None:
        """Send `sig` to its process group (own session) or to the child alone (no own session)."""
        _signal(self.pid, sig, group=self.own_session)

    def kill(self, wait: float | None = 30.0) -> int | None:
        """SIGKILL its process group (the child alone without own session); wait up to `wait`
        seconds (None: for ever) for it to exit."""
        self.signal_group(signal.SIGKILL)
        return self.wait(wait)

    def stop(self, timeout: float, *, kill_wait: float | None = 30.0) -> int | None:
        """SIGTERM the child (a clean stop); if it has not exited within `timeout`, `kill()`.

        Returns:
            Its exit status (None if even the SIGKILL did not end it within `kill_wait`).
        """
        if self.proc.poll() is None:
            self.send_signal(signal.SIGTERM)
            if self.wait(timeout) is None:
                logger.warning(
                    "%s pid %d ignored SIGTERM for %gs: killing", self.name, self.pid, timeout
                )
                self.kill(kill_wait)
        return self.proc.poll()

    def reap(self, timeout: float = 15.0) -> None:
        """Wait for the rest of its session to go, SIGKILLing stragglers after `timeout`: the
        processes of a dead child must not outlive it (own session only)."""
        if not self.own_session:
            return
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if not session_processes(self.pid):
                return
            time.sleep(0.2)
        for pid in session_processes(self.pid):
            logger.warning("%s: process %d outlived it: killing it", self.name, pid)
            _signal(pid, signal.SIGKILL)

    def log_text(self) -> str:
        """Its log file's text ('' without one)."""
        if self.log is None:
            return ""
        try:
            return self.log.read_text(encoding="utf-8", errors="replace")
        except OSError:
            return ""

    def log_tail(self, lines: int = 20) -> str:
        return "\n".join(self.log_text().splitlines()[-lines:])


def spawn(
    argv: Sequence[str],
    *,
    log: Path | None,
    name: str = "",
    env: Mapping[str, str] | None = None,
    cwd: str | Path | None = None,
    own_session: bool = True,
    append: bool = True,
) -> Child:
    """Start `argv` with stdin from /dev/null and stdout+stderr into `log`.

    Args:
        argv: the command line.
        log: the file that receives its output (appended to, or truncated with `append=False`);
            None leaves it on this process's stdout and stderr.
        name: what log lines call it (default: the program's name).
        env: its environment (None: this process's).
        cwd: its working directory (None: this process's).
        own_session: lead a new session and process group (see `Child`).
        append: append to `log` rather than truncate it.

    Raises:
        OSError: the log cannot be opened or the program cannot be run.
    """
    out: IO[bytes] | None = None
    if log is not None:
        out = open(log, "ab" if append else "wb")  # noqa: SIM115 - handed to the child
    try:
        proc = subprocess.Popen(
            list(argv),
            env=dict(env) if env is not None else None,
            cwd=cwd,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT if out is not None else None,
            start_new_session=own_session,
        )
    finally:
        if out is not None:
            out.close()
    return Child(proc, log, name or Path(argv[0]).name, own_session)


def _wait_gone(pid: int, timeout: float, child: Child | None) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if child is not None and child.pid == pid:
            if child.poll() is not None:  # reaps our own child, which would stay a zombie
                return
        elif not pid_alive(pid):
            return
        time.sleep(0.05)


def kill_pid(pid: int, wait: float = 5.0, *, child: Child | None = None) -> None:
    """SIGKILL `pid` (not necessarily our child) and wait up to `wait` seconds for it to go.
    `child`, when it is that process, is reaped."""
    _signal(pid, signal.SIGKILL)
    _wait_gone(pid, wait, child)


def stop_pid(
    pid: int,
    timeout: float,
    *,
    name: str = "process",
    child: Child | None = None,
    kill_wait: float = 5.0,
) -> None:
    """Stop `pid` (not necessarily our child, e.g. one recorded in a state file): SIGTERM, then
    SIGKILL if it is still alive after `timeout` seconds."""
    _signal(pid, signal.SIGTERM)
    _wait_gone(pid, timeout, child)
    if pid_alive(pid):
        logger.warning("%s pid %d ignored SIGTERM for %gs; killing it", name, pid, timeout)
        kill_pid(pid, kill_wait, child=child)
