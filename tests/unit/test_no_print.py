"""Library code logs through module loggers or hands its lines to a caller's `say`: only the
command-line layer (ipcount/cli.py, ipcount/commands/, the bench's subcommands) and the
stand-alone peer scripts (ipcount/bench/peers/) write to stdout with print()."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "ipcount"
# The command-line layer: what a user runs, which prints what the library returns or says.
CLI_LAYER = (
    PACKAGE / "cli.py",
    PACKAGE / "__main__.py",
    PACKAGE / "commands",
    PACKAGE / "bench" / "subcommands.py",
    PACKAGE / "bench" / "peers",
)


def _library_modules() -> list[Path]:
    return [
        path
        for path in sorted(PACKAGE.rglob("*.py"))
        if not any(path == top or top in path.parents for top in CLI_LAYER)
    ]


def _print_calls(path: Path) -> list[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    return [
        f"{path.relative_to(ROOT)}:{node.lineno}"
        for node in ast.walk(tree)
        if isinstance(node, ast.Call)
        and isinstance(node.func, ast.Name)
        and node.func.id == "print"
    ]


def test_library_modules_do_not_print() -> None:
    found = [call for path in _library_modules() for call in _print_calls(path)]
    assert not found, (
        "print() in library code (log through the module logger, or return lines / take a "
        "`say` callback that the command layer prints): " + ", ".join(found)
    )


def test_the_check_reads_the_benchmarks() -> None:
    # The benchmarks' library modules are checked; only their command layer is exempt.
    checked = {p.relative_to(PACKAGE).as_posix() for p in _library_modules()}
    assert {"bench/latency.py", "bench/sink.py", "bench/source.py"} <= checked
    assert "bench/subcommands.py" not in checked
    assert not any(name.startswith(("commands/", "bench/peers/")) for name in checked)
