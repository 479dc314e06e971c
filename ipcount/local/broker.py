"""One interface for the local Kafka brokers (noida-db, Apache Kafka in KRaft mode): start with
readiness by metadata, stop by PID, kill, pause; the PID recorded in the broker's data dir with
the process's start time and boot id, so a reused PID is never signalled."""

from __future__ import annotations

import contextlib
import json
import logging
import os
import signal
import socket
import time
from dataclasses import dataclass
from pathlib import Path

from ipcount.childproc import Child, kill_pid, pid_alive, process_identity, spawn, stop_pid
from ipcount.errors import BrokerError
from ipcount.kafka.client import wait_for_metadata

__all__ = ["LocalBroker", "BrokerStatus", "free_port"]

logger = logging.getLogger(__name__)

_STATE_FILE = "ipcount-broker.json"
_LOG_FILE = "broker.log"


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port that is free on `host` right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def _port_free(host: str, port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind((host, port))
        except OSError:
            return False
    return True


@dataclass(frozen=True)
class BrokerStatus:
    """What `ipcount broker status` reports."""

    running: bool
    pid: int | None
    bootstrap: str
    data_dir: str
    kind: str = "noida-db"


class LocalBroker:
    """A local broker process on `host:port` with its own data dir, where its PID is recorded.

    Subclasses say how to run it (`command`, `prepare`) and what it guarantees:
    `durable_kill` is True when a SIGKILL loses nothing the broker acknowledged.
    """

    kind = "abstract"
    durable_kill = True

    def __init__(self, data_dir: str | Path, host: str = "127.0.0.1", port: int = 9092) -> None:
        self.data_dir = Path(data_dir).resolve()
        self.host = host
        self.port = port
        self._child: Child | None = None

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.bootstrap}, data_dir={str(self.data_dir)!r})"

    # --- what a kind provides -------------------------------------------------------------

    def command(self) -> list[str]:
        """The broker's command line."""
        raise NotImplementedError

    def prepare(self) -> None:
        """Everything the first start needs in the data dir (config, formatted storage)."""

    def child_env(self) -> dict[str, str] | None:
        """The broker's environment (None: this process's)."""
        return None

    # --- common ----------------------------------------------------------------------------

    @property
    def bootstrap(self) -> str:
        """host:port for kafka.bootstrap_servers."""
        return f"{self.host}:{self.port}"

    @property
    def state_file(self) -> Path:
        return self.data_dir / _STATE_FILE

    @property
    def log_file(self) -> Path:
        return self.data_dir / _LOG_FILE

    @property
    def pid(self) -> int | None:
        """The recorded PID if that process is alive and is the one recorded."""
        pid = self._recorded_pid()
        if pid is None or not pid_alive(pid) or self.stale_reason() is not None:
            return None
        return pid

    def _state(self) -> dict[str, object]:
        try:
            state = json.loads(self.state_file.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return {}
        return state if isinstance(state, dict) else {}

    def _recorded_pid(self) -> int | None:
        try:
            return int(self._state()["pid"])  # type: ignore[call-overload]
        except (ValueError, KeyError, TypeError):
            return None

    def stale_reason(self) -> str | None:
        """Why the state file's PID is not the broker that was started, when a live process has
        that PID but another start time or boot (the broker died, by a crash or a reboot, and
        the PID was reused); None when it is, or when nothing can tell (no /proc, a state file
        of an older ipcount)."""
        state = self._state()
        pid = self._recorded_pid()
        if pid is None or "start_ticks" not in state or not pid_alive(pid):
            return None
        now = process_identity(pid)
        if now is None:
            return None
        if now["boot_id"] != state.get("boot_id"):
            why = "the machine has rebooted since the broker started"
        elif now["start_ticks"] != str(state.get("start_ticks")):
            why = "that process started later than the broker did"
        else:
            return None
        return (
            f"{self.state_file} names pid {pid}, but {why}: pid {pid} is another process now "
            f"(the {self.kind} broker it recorded is gone)"
        )

    def _forget_stale(self) -> bool:
        """Remove a stale state file (see `stale_reason`); True if it was stale."""
        reason = self.stale_reason()
        if reason is None:
            return False
        logger.warning("%s; not signalling it, removing the stale state file", reason)
        self.state_file.unlink(missing_ok=True)
        return True

    def status(self) -> BrokerStatus:
        """Whether the broker recorded in the data dir is running."""
        pid = self.pid
        return BrokerStatus(pid is not None, pid, self.bootstrap, str(self.data_dir), self.kind)

    def start(self, timeout: float = 30.0) -> int:
        """Start the broker in the background and wait until it answers a metadata request.

        Returns:
            The broker's PID.

        Raises:
            BrokerError: already running, port taken, cannot be prepared, or not ready within
                `timeout` seconds.
        """
        current = self.status()
        if current.running:
            raise BrokerError(
                f"the local broker is already running (pid {current.pid}, {self.bootstrap}, "
                f"data dir {self.data_dir}); `ipcount broker stop` stops it"
            )
        if not _port_free(self.host, self.port):
            raise BrokerError(
                f"port {self.port} on {self.host} is in use by another process; "
                "choose another with broker.port (env IPCOUNT_BROKER_PORT)"
            )
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self.prepare()
        cmd = self.command()
        # Own session: a Ctrl-C in the terminal that started it does not stop the broker.
        child = spawn(cmd, log=self.log_file, name=self.kind, env=self.child_env())
        self._child = child
        state: dict[str, object] = {
            "pid": child.pid,
            "host": self.host,
            "port": self.port,
            "kind": self.kind,
            **(process_identity(child.pid) or {}),
        }
        self.state_file.write_text(json.dumps(state), encoding="utf-8")
        logger.info(
            "started %s pid %d on %s (data dir %s)",
            self.kind,
            child.pid,
            self.bootstrap,
            self.data_dir,
        )
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if child.poll() is not None:
                self.state_file.unlink(missing_ok=True)
                raise BrokerError(
                    f"{self.kind} exited with status {child.returncode} while starting; "
                    f"see {self.log_file}:\n" + self._log_tail()
                )
            try:
                wait_for_metadata({"bootstrap.servers": self.bootstrap}, timeout=1.0)
                return child.pid
            except BrokerError:
                continue
        self.stop()
        raise BrokerError(
            f"{self.kind} did not answer on {self.bootstrap} within {timeout:g}s; "
            f"see {self.log_file}:\n" + self._log_tail()
        )

    def stop(self, timeout: float = 15.0) -> bool:
        """Stop the recorded broker by PID (SIGTERM, then SIGKILL); False if none was running.
        A state file whose PID now names another process (see `stale_reason`) is removed and
        nothing is signalled."""
        pid = self._recorded_pid()
        if pid is None or not pid_alive(pid) or self._forget_stale():
            self.state_file.unlink(missing_ok=True)
            return False
        self.resume()  # a stopped (SIGSTOP) process would not handle SIGTERM
        stop_pid(pid, timeout, name=self.kind, child=self._child)
        self.state_file.unlink(missing_ok=True)
        logger.info("stopped %s pid %d", self.kind, pid)
        return True

    def kill(self) -> None:
        """SIGKILL the broker (for crash tests); the data dir survives for a restart."""
        pid = self._recorded_pid()
        if pid is not None and pid_alive(pid) and not self._forget_stale():
            kill_pid(pid, 5.0, child=self._child)
        self.state_file.unlink(missing_ok=True)

    def pause(self) -> None:
        """SIGSTOP the broker: a hung broker (connections open, nothing answered)."""
        pid = self.pid
        if pid is None:
            raise BrokerError(f"no {self.kind} broker is running for {self.data_dir}")
        os.kill(pid, signal.SIGSTOP)

    def resume(self) -> None:
        """SIGCONT a paused broker (a no-op for a running one)."""
        pid = self.pid
        if pid is not None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGCONT)

    def _log_tail(self, lines: int = 20) -> str:
        try:
            text = self.log_file.read_text(encoding="utf-8", errors="replace").splitlines()
        except OSError:
            return ""
        return "\n".join(text[-lines:])
