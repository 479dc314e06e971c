"""Optional dependencies: the job needs none of them; `loadgen serve` and `ipcount bench` do."""

from __future__ import annotations

import importlib.util

from ipcount.errors import ConfigError

__all__ = ["require"]


def require(command: str, extra: str, *modules: str) -> None:
    """Fail with the pip command to run when `command` needs modules that are not installed.

    Raises:
        ConfigError: naming the missing modules and the extra that installs them.
    """
    missing = [m for m in modules if importlib.util.find_spec(m) is None]
    if missing:
        raise ConfigError(
            f"{command} needs {', '.join(missing)}, which the job itself does not: "
            f"pip install 'ipcount[{extra}]'"
        )
