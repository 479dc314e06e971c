"""Where things are on this host (ipcount's cache directory, the java binary), and what a
directory holds."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

__all__ = ["cache_root", "find_java", "tree_bytes"]


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


def tree_bytes(root: Path) -> tuple[int, int]:
    """(bytes, files) under `root` (0, 0 when it does not exist)."""
    size = files = 0
    for dirpath, _dirs, names in os.walk(root):
        for name in names:
            try:
                size += os.stat(os.path.join(dirpath, name)).st_size
            except FileNotFoundError:
                continue
            files += 1
    return size, files
