"""The local noida-db Kafka broker for development, the demo and tests: start, readiness, stop by
PID."""

from __future__ import annotations

import contextlib
import errno
import importlib.resources
import json
import logging
import os
import signal
import socket
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

from ipcount.errors import BrokerError
from ipcount.kafka.client import wait_for_metadata

__all__ = ["LocalBroker", "BrokerStatus", "noida_binary", "free_port"]

logger = logging.getLogger(__name__)

_STATE_FILE = "ipcount-broker.json"
_LOG_FILE = "broker.log"


def noida_binary() -> Path:
    """The noida-db executable shipped in the `noida-db` wheel (the binary, not its Python wrapper).

    Raises:
        BrokerError: when the package is not installed.
    """
    try:
        path = Path(str(importlib.resources.files("noida_db") / "noida-db"))
    except ModuleNotFoundError:
        raise BrokerError(
            "the local broker needs the noida-db package: pip install 'ipcount[dev]' "
            "(or point kafka.bootstrap_servers at a running Kafka)"
        ) from None
    if not path.is_file():
        raise BrokerError(f"noida-db binary not found at {path}; reinstall noida-db==0.2.3")
    if not os.access(path, os.X_OK):
        path.chmod(path.stat().st_mode | 0o111)
    return path


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port that is free on `host` right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except OSError as exc:
        return exc.errno == errno.EPERM
    # A zombie child still answers kill(0); treat it as gone.
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii") as fh:
            return fh.read().split(")")[-1].split()[0] != "Z"
    except OSError:
        return True


@dataclass(frozen=True)
class BrokerStatus:
    """What `ipcount broker status` reports."""

    running: bool
    pid: int | None
    bootstrap: str
    data_dir: str


class LocalBroker:
    """A noida-db broker on `host:port` with its own data dir, where its PID is recorded."""

    def __init__(self, data_dir: str | Path, host: str = "127.0.0.1", port: int = 9092) -> None:
        self.data_dir = Path(data_dir).resolve()
        self.host = host
        self.port = port
        self._proc: subprocess.Popen[bytes] | None = None

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

    def _recorded_pid(self) -> int | None:
        try:
            state = json.loads(self.state_file.read_text(encoding="utf-8"))
            return int(state["pid"])
        except (OSError, ValueError, KeyError, TypeError):
            return None

    def status(self) -> BrokerStatus:
        """Whether the broker recorded in the data dir is running."""
        pid = self._recorded_pid()
        running = pid is not None and _pid_alive(pid)
        return BrokerStatus(running, pid if running else None, self.bootstrap, str(self.data_dir))

    def start(self, timeout: float = 30.0) -> int:
        """Start the broker in the background and wait until it answers a metadata request.

        Returns:
            The broker's PID.

        Raises:
            BrokerError: already running, port taken, or not ready within `timeout` seconds.
        """
        current = self.status()
        if current.running:
            raise BrokerError(
                f"the local broker is already running (pid {current.pid}, {self.bootstrap}, "
                f"data dir {self.data_dir}); `ipcount broker stop` stops it"
            )
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                probe.bind((self.host, self.port))
            except OSError:
                raise BrokerError(
                    f"port {self.port} on {self.host} is in use by another process; "
                    "choose another with broker.port (env IPCOUNT_BROKER_PORT)"
                ) from None
        self.data_dir.mkdir(parents=True, exist_ok=True)
        cmd = [
            str(noida_binary()),
            "start",
            "--data-dir",
            str(self.data_dir),
            "--host",
            self.host,
            "--only",
            "kafka",
            "--kafka-port",
            str(self.port),
        ]
        log = open(self.log_file, "ab")  # noqa: SIM115 - handed to the child
        try:
            # Own session: a Ctrl-C in the terminal that started it does not stop the broker.
            proc = subprocess.Popen(
                cmd,
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
            )
        finally:
            log.close()
        self._proc = proc
        self.state_file.write_text(
            json.dumps({"pid": proc.pid, "host": self.host, "port": self.port}), encoding="utf-8"
        )
        logger.info(
            "started noida-db pid %d on %s (data dir %s)", proc.pid, self.bootstrap, self.data_dir
        )
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                self.state_file.unlink(missing_ok=True)
                raise BrokerError(
                    f"noida-db exited with status {proc.returncode} while starting; "
                    f"see {self.log_file}:\n" + self._log_tail()
                )
            try:
                wait_for_metadata({"bootstrap.servers": self.bootstrap}, timeout=1.0)
                return proc.pid
            except BrokerError:
                continue
        self.stop()
        raise BrokerError(
            f"noida-db did not answer on {self.bootstrap} within {timeout:g}s; see {self.log_file}"
        )

    def stop(self, timeout: float = 15.0) -> bool:
        """Stop the recorded broker by PID (SIGTERM, then SIGKILL); False if none was running."""
        pid = self._recorded_pid()
        if pid is None or not _pid_alive(pid):
            self.state_file.unlink(missing_ok=True)
            return False
        self._signal_and_wait(pid, signal.SIGTERM, timeout)
        if _pid_alive(pid):
            logger.warning("noida-db pid %d ignored SIGTERM for %gs; killing it", pid, timeout)
            self._signal_and_wait(pid, signal.SIGKILL, 5.0)
        self.state_file.unlink(missing_ok=True)
        logger.info("stopped noida-db pid %d", pid)
        return True

    def kill(self) -> None:
        """SIGKILL the broker (for crash tests); the data dir survives for a restart."""
        pid = self._recorded_pid()
        if pid is not None and _pid_alive(pid):
            self._signal_and_wait(pid, signal.SIGKILL, 5.0)
        self.state_file.unlink(missing_ok=True)

    def _signal_and_wait(self, pid: int, sig: int, timeout: float) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, sig)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self._proc is not None and self._proc.pid == pid:
                if self._proc.poll() is not None:
                    return
            elif not _pid_alive(pid):
                return
            time.sleep(0.05)

    def _log_tail(self, lines: int = 20) -> str:
        try:
            text = self.log_file.read_text(encoding="utf-8", errors="replace").splitlines()
        except OSError:
            return ""
        return "\n".join(line for line in text[-lines:] if "GLIBC_2.39" not in line)
