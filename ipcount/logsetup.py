"""Logging set-up for entry points; library modules only use `logging.getLogger(__name__)`."""

from __future__ import annotations

import logging
import os
import sys

__all__ = ["configure"]

_FORMAT = "%(asctime)s %(levelname)-5s %(name)s: %(message)s"


def configure(level: str | int | None = None) -> None:
    """Configure root logging once for a CLI process.

    Args:
        level: a level name or number; defaults to env ``IPCOUNT_LOG_LEVEL`` or INFO.
    """
    chosen = level if level is not None else os.environ.get("IPCOUNT_LOG_LEVEL", "INFO")
    if isinstance(chosen, str):
        chosen = chosen.upper()
    root = logging.getLogger()
    if not any(getattr(h, "_ipcount", False) for h in root.handlers):
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter(_FORMAT, datefmt="%H:%M:%S"))
        handler._ipcount = True  # type: ignore[attr-defined]
        root.addHandler(handler)
    root.setLevel(chosen)
    # py4j logs every gateway call at INFO/DEBUG: keep it quiet.
    logging.getLogger("py4j").setLevel(logging.WARNING)
