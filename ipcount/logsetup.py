"""Logging set-up for entry points (`configure`); library modules only use a module logger. Formats:
`text` (one readable line per record) or `json` (one object per line; a record logged with
``extra={"fields": {...}}`` carries those fields)."""

from __future__ import annotations

import json
import logging
import os
import sys
from datetime import UTC, datetime
from typing import IO, Any

__all__ = ["configure", "configure_worker", "current", "make_handler", "JsonFormatter", "FORMATS"]

_FORMAT = "%(asctime)s %(levelname)-5s %(name)s: %(message)s"
FORMATS = ("text", "json")
# The keys every JSON line has; a record's own fields never replace them.
_BASE_KEYS = ("time", "level", "logger", "message")


class JsonFormatter(logging.Formatter):
    """One JSON object per record: time (UTC, ISO 8601), level, logger, message, the record's
    `fields` (extra={"fields": {...}}), and exception/stack text when present."""

    def format(self, record: logging.LogRecord) -> str:
        out: dict[str, Any] = {
            "time": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        fields = getattr(record, "fields", None)
        if isinstance(fields, dict):
            for key, value in fields.items():
                if key not in _BASE_KEYS:
                    out[str(key)] = value
        if record.exc_info:
            out["exception"] = self.formatException(record.exc_info)
        if record.stack_info:
            out["stack"] = self.formatStack(record.stack_info)
        return json.dumps(out, default=str, ensure_ascii=False)


def make_handler(log_format: str, stream: IO[str] | None = None) -> logging.Handler:
    """A stream handler (stderr by default) writing `text` or `json` lines.

    Raises:
        ValueError: an unknown format.
    """
    if log_format not in FORMATS:
        raise ValueError(f"log format must be one of {', '.join(FORMATS)}, got {log_format!r}")
    handler = logging.StreamHandler(stream if stream is not None else sys.stderr)
    if log_format == "json":
        handler.setFormatter(JsonFormatter())
    else:
        handler.setFormatter(logging.Formatter(_FORMAT, datefmt="%H:%M:%S"))
    return handler


def configure(level: str | int | None = None, log_format: str | None = None) -> None:
    """Configure root logging once for a CLI process.

    Args:
        level: a level name or number; defaults to env ``IPCOUNT_LOG_LEVEL`` or INFO.
        log_format: ``text`` or ``json``; defaults to env ``IPCOUNT_LOG_FORMAT`` or text.
    """
    chosen = level if level is not None else os.environ.get("IPCOUNT_LOG_LEVEL", "INFO")
    if isinstance(chosen, str):
        chosen = chosen.upper()
    fmt = (log_format or os.environ.get("IPCOUNT_LOG_FORMAT") or "text").lower()
    root = logging.getLogger()
    for old in [h for h in root.handlers if getattr(h, "_ipcount", False)]:
        root.removeHandler(old)
    handler = make_handler(fmt)
    handler._ipcount = True  # type: ignore[attr-defined]
    root.addHandler(handler)
    root.setLevel(chosen)
    # py4j logs every gateway call at INFO/DEBUG: keep it quiet.
    logging.getLogger("py4j").setLevel(logging.WARNING)


def current() -> tuple[str, str]:
    """This process's level (of the `ipcount` loggers) and format, as `configure` set them: what
    a Spark Python worker of the job is given (`configure_worker`)."""
    level = logging.getLevelName(logging.getLogger("ipcount").getEffectiveLevel())
    mine = [h for h in logging.getLogger().handlers if getattr(h, "_ipcount", False)]
    fmt = "json" if mine and isinstance(mine[0].formatter, JsonFormatter) else "text"
    return str(level), fmt


def configure_worker(level: str, log_format: str) -> None:
    """Configure logging once in a Spark Python worker, at the job's level and format (`current`
    in the driver): its stderr reaches the executor's log (local mode: the job's own stderr). A
    worker is reused across tasks; later calls change nothing."""
    if any(getattr(h, "_ipcount", False) for h in logging.getLogger().handlers):
        return
    try:
        configure(level, log_format)
    except ValueError:
        configure("INFO", "text")
