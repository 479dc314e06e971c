"""The noida-db local broker: a small binary from PyPI that speaks Kafka's wire protocol, the
JVM-free stand-in (it needs nothing but pip), chosen with `broker.kind = "noida-db"` (env
IPCOUNT_BROKER_KIND; IPCOUNT_TEST_BROKER=noida-db for the tests). Apache Kafka (`kraft.py`) is the
default for the demo and the tests."""

from __future__ import annotations

import importlib.resources
import os
from pathlib import Path

from ipcount.errors import BrokerError
from ipcount.local.broker import LocalBroker

__all__ = ["NoidaBroker", "noida_binary"]


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


class NoidaBroker(LocalBroker):
    """A noida-db broker on `host:port` with its own data dir.

    Its durability differs from Apache Kafka's: it saves its state about once a second, so a
    SIGKILL loses the acknowledged writes of the last second (`durable_kill` is False).
    """

    kind = "noida-db"
    durable_kill = False

    def command(self) -> list[str]:
        return [
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

    def _log_tail(self, lines: int = 20) -> str:
        # The wheel's binary warns about a newer glibc on every start: noise, not the cause.
        return "\n".join(
            line for line in super()._log_tail(lines).splitlines() if "GLIBC_2.39" not in line
        )
