"""Where things are on this host: ipcount's cache directory and the java binary."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

__all__ = ["cache_root", "find_java"]


def cache_root() -> Path:
    """Where ipcount keeps built things: $XDG_CACHE_HOME/ipcount (default ~/.cache/ipcount)."""
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "ipcount"


def find_java() -> Path | None:
    """`$JAVA_HOME/bin/java` when it exists, else `java` on the PATH; None when neither."""
    home = os.environ.get("JAVA_HOME")
    if home and (Path(home) / "bin" / "java").is_file():
        return Path(home) / "bin" / "java"
    found = shutil.which("java")
    return Path(found) if found else None
