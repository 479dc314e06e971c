"""A local Spark standalone cluster (one master, N workers) from the installed PySpark: for tests
and for trying the cluster deployment on one machine (driver side; nothing runs on executors).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import signal
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ipcount.childproc import Child, session_processes, spawn
from ipcount.errors import IpcountError
from ipcount.local.broker import free_port

__all__ = [
    "MASTER_CLASS",
    "WORKER_CLASS",
    "spark_home",
    "spark_class",
    "Daemon",
    "StandaloneCluster",
]

logger = logging.getLogger(__name__)

MASTER_CLASS = "org.apache.spark.deploy.master.Master"
WORKER_CLASS = "org.apache.spark.deploy.worker.Worker"


def spark_home() -> Path:
    """SPARK_HOME of the installed PySpark (its jars and bin/ scripts)."""
    import pyspark

    return Path(pyspark.__file__).resolve().parent


def spark_class() -> Path:
    """The installed PySpark's bin/spark-class, which runs the master and worker daemons."""
    return spark_home() / "bin" / "spark-class"


@dataclass
class Daemon:
    """One master or worker JVM started here (its own process group; output in `log`)."""

    name: str
    child: Child
    log: Path
    webui_port: int
    work_dir: Path | None = None

    def log_tail(self, lines: int = 20) -> str:
        return self.child.log_tail(lines)


class StandaloneCluster:
    """A master and `workers` workers on `host`, each with its own work dir under `base_dir`.

    Usage: `with StandaloneCluster(tmp, workers=2) as cluster: ... cluster.master_url ...`.
    Every daemon binds to `host` (SPARK_LOCAL_IP and --host); stop() ends them by PID.

    Args:
        base_dir: directory for daemon logs and worker work dirs (created).
        workers: number of workers.
        cores: cores each worker offers.
        memory: memory each worker offers to executors (e.g. "1g").
        host: address every daemon binds to and advertises.
        conf_dir: SPARK_CONF_DIR for the daemons; executors inherit its log4j2.properties.
        daemon_memory: heap of each master/worker JVM (SPARK_DAEMON_MEMORY).
    """

    def __init__(
        self,
        base_dir: str | Path,
        *,
        workers: int = 2,
        cores: int = 1,
        memory: str = "1g",
        host: str = "127.0.0.1",
        conf_dir: str | Path | None = None,
        daemon_memory: str = "256m",
    ) -> None:
        self.base_dir = Path(base_dir)
        self.workers_wanted = workers
        self.cores = cores
        self.memory = memory
        self.host = host
        self.conf_dir = Path(conf_dir) if conf_dir is not None else None
        self.daemon_memory = daemon_memory
        self.master: Daemon | None = None
        self.workers: list[Daemon] = []
        self.master_port = 0

    @property
    def master_url(self) -> str:
        """spark://host:port, for spark-submit --master."""
        return f"spark://{self.host}:{self.master_port}"

    @property
    def work_dirs(self) -> list[Path]:
        """The workers' work dirs, each holding <app id>/<executor id>/{stdout,stderr}."""
        return [w.work_dir for w in self.workers if w.work_dir is not None]

    def _env(self) -> dict[str, str]:
        env = {
            **os.environ,
            "SPARK_HOME": str(spark_home()),
            "SPARK_LOCAL_IP": self.host,
            "SPARK_DAEMON_MEMORY": self.daemon_memory,
        }
        if self.conf_dir is not None:
            env["SPARK_CONF_DIR"] = str(self.conf_dir)
        return env

    def _spawn(self, name: str, args: list[str], webui_port: int, work_dir: Path | None) -> Daemon:
        log = self.base_dir / f"{name}.log"
        # Its own group: stop() can end its executors too.
        child = spawn([str(spark_class()), *args], log=log, name=f"Spark {name}", env=self._env())
        logger.info("started Spark %s (pid %d, log %s)", name, child.pid, log)
        return Daemon(name, child, log, webui_port, work_dir)

    def start(self, timeout: float = 90.0) -> StandaloneCluster:
        """Start the master, then the workers; return once every worker is ALIVE at the master.

        Raises:
            IpcountError: a daemon exited or the workers did not register within `timeout`; or
                the cluster is running already (a second start would lose track of it).
        """
        if self.master is not None and self.master.child.poll() is None:
            raise IpcountError(f"the Spark standalone cluster {self.master_url} is running already")
        self.base_dir.mkdir(parents=True, exist_ok=True)
        self.master, self.workers = None, []
        deadline = time.monotonic() + timeout
        try:
            self.master_port = free_port(self.host)
            webui = free_port(self.host)
            self.master = self._spawn(
                "master",
                [MASTER_CLASS, "--host", self.host, "--port", str(self.master_port)]
                + ["--webui-port", str(webui)],
                webui,
                None,
            )
            for i in range(self.workers_wanted):
                self.workers.append(self._spawn_worker(i))
            self._wait_alive(deadline)
        except BaseException:
            self.stop()
            raise
        logger.info(
            "Spark standalone cluster %s with %d workers", self.master_url, len(self.workers)
        )
        return self

    def _spawn_worker(self, i: int) -> Daemon:
        work_dir = self.base_dir / f"worker-{i}"
        work_dir.mkdir(exist_ok=True)
        port = free_port(self.host)
        return self._spawn(
            f"worker-{i}",
            [WORKER_CLASS, self.master_url, "--host", self.host, "--port", "0"]
            + ["--webui-port", str(port), "--cores", str(self.cores)]
            + ["--memory", self.memory, "--work-dir", str(work_dir)],
            port,
            work_dir,
        )

    def restart_worker(self, i: int, timeout: float = 90.0) -> Daemon:
        """Start worker `i` again (after it died or was killed) with its work dir; return once
        the master lists as many ALIVE workers as the cluster has.

        Raises:
            IpcountError: it did not register within `timeout`.
        """
        old = self.workers[i]
        old.child.signal_group(signal.SIGKILL)  # whatever of it is left
        old.child.reap()
        new = self.workers[i] = self._spawn_worker(i)
        deadline = time.monotonic() + timeout
        # The master may list the dead worker as ALIVE for a while (spark.worker.timeout): wait
        # for this one, by its web UI port.
        while time.monotonic() < deadline:
            if new.child.poll() is not None:
                raise IpcountError(f"Spark {new.name} exited:\n{new.log_tail()}")
            with contextlib.suppress(OSError, urllib.error.URLError, ValueError):
                for w in self.status().get("workers", []):
                    url = str(w.get("webuiaddress", ""))
                    if w.get("state") == "ALIVE" and url.endswith(f":{new.webui_port}"):
                        return new
            time.sleep(0.5)
        raise IpcountError(f"Spark {new.name} did not register within {timeout:g}s")

    def executor_processes(self, i: int) -> list[int]:
        """PIDs of worker `i`'s executors: their JVMs and Python workers (everything in the
        worker's session but the worker JVM itself)."""
        pid = self.workers[i].child.pid
        return [p for p in session_processes(pid) if p != pid]

    def kill_executors(self, i: int) -> list[int]:
        """SIGKILL worker `i`'s executors (JVMs and Python workers); the worker stays, reports
        them lost and starts new ones for the application. Returns the PIDs signalled."""
        victims = self.executor_processes(i)
        for pid in victims:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        if victims:
            logger.info("SIGKILLed the executors of Spark %s: %s", self.workers[i].name, victims)
        return victims

    def status(self) -> dict[str, Any]:
        """The master's JSON status (workers, applications), from its web UI on `host`."""
        if self.master is None:
            raise IpcountError("the cluster is not started")
        url = f"http://{self.host}:{self.master.webui_port}/json/"
        with urllib.request.urlopen(url, timeout=5) as resp:  # noqa: S310 - http on loopback
            return dict(json.loads(resp.read().decode("utf-8")))

    def _wait_alive(self, deadline: float) -> None:
        last: Any = None
        while time.monotonic() < deadline:
            for daemon in [d for d in (self.master, *self.workers) if d is not None]:
                if daemon.child.poll() is not None:
                    raise IpcountError(
                        f"Spark {daemon.name} exited with status {daemon.child.returncode}:\n"
                        f"{daemon.log_tail()}"
                    )
            try:
                last = self.status()
            except (OSError, urllib.error.URLError, ValueError) as exc:
                last = exc
            else:
                alive = [w for w in last.get("workers", []) if w.get("state") == "ALIVE"]
                if last.get("status") == "ALIVE" and len(alive) >= self.workers_wanted:
                    return
            time.sleep(0.5)
        raise IpcountError(
            f"Spark standalone cluster not ready in time (last status: {last!r});\n"
            f"master log:\n{self.master.log_tail() if self.master else ''}"
        )

    def stop(self, timeout: float = 20.0) -> None:
        """Stop the workers (which kill their executors), then the master: SIGTERM by PID, then
        SIGKILL to the daemon's own process group if it has not exited within `timeout`.

        The daemons stay listed (ports, work dirs, logs) for inspection after the stop.
        """
        for daemon in [*reversed(self.workers), *([self.master] if self.master else [])]:
            daemon.child.stop(timeout, kill_wait=10)
            # Executors a worker launched share its process group; end any it left behind.
            daemon.child.signal_group(signal.SIGKILL)

    def __enter__(self) -> StandaloneCluster:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
