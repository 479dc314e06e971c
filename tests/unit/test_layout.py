"""The package layout holds: no import cycles, imports only point down the layers (the job on top
of source and sink, both on kafka and formats), and no module grows past ~400 lines."""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
MAX_LINES = 400  # split a module when it takes on a second job
MAX_FUNCTION_LINES = 100  # a function reads as a list of named steps: past ~60 lines, split

# Lowest first. A module may import its own group and any group of a lower layer, never a higher
# one; groups sharing a layer are peers and do not import each other (source and sink meet only
# in the job). Lazy imports inside functions count too.
LAYERS: list[set[str]] = [
    {"ipcount", "ipcount.errors", "ipcount.queries"},
    {
        "ipcount.faults",
        "ipcount.worker_gc",
        "ipcount.logsetup",
        "ipcount.childproc",
        "ipcount.hostpaths",
        "ipcount.observe.httpserve",
    },
    {"ipcount.config"},
    {"ipcount.formats"},
    {"ipcount.kafka", "ipcount.checkpoint"},
    {"ipcount.source", "ipcount.sink"},
    # Observability (metrics, health, the HTTP endpoint and server, progress lines): used by the
    # job and the dashboard, it imports neither.
    {"ipcount.observe"},
    {"ipcount.job", "ipcount.verify", "ipcount.local", "ipcount.dashboard"},
    # One local pipeline run (broker, topics, job and generator processes, verify): what the demo,
    # chaos, the soak and the benchmarks share. Above the brokers and verify, below its users.
    {"ipcount.local_pipeline"},
    {"ipcount.chaos", "loadgen"},
    # The soak runs a job like chaos does (its broker, topics, generator and job processes).
    {"ipcount.soak"},
    # The benchmarks (`ipcount bench`) run the whole pipeline; they import loadgen's generator to
    # pre-load records in-process (the latency bench runs `loadgen synth` as a child, as chaos does).
    {"ipcount.commands", "ipcount.bench"},
    {"ipcount.cli"},
    {"loadgen.cli"},
    {"ipcount.__main__", "loadgen.__main__"},
]
# The job's packages: what runs inside Spark (driver and executors).
JOB_PACKAGES = {
    "ipcount.source",
    "ipcount.sink",
    "ipcount.job",
    "ipcount.formats",
    "ipcount.kafka",
    "ipcount.checkpoint",
}


def _modules() -> dict[str, Path]:
    found = {}
    for top in ("ipcount", "loadgen"):
        for path in sorted((ROOT / top).rglob("*.py")):
            rel = path.relative_to(ROOT).with_suffix("")
            name = ".".join(rel.parts).removesuffix(".__init__")
            found[name] = path
    return found


MODULES = _modules()


def _imports(path: Path) -> Iterator[str]:
    """Every ipcount/loadgen module `path` imports, at the top or inside a function."""
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            # `from pkg import mod` imports pkg.mod when that is a module, else a name of pkg.
            names = [node.module, *(f"{node.module}.{a.name}" for a in node.names)]
        else:
            continue
        yield from (n for n in names if n in MODULES)


GRAPH = {name: set(_imports(path)) - {name} for name, path in MODULES.items()}


def _group(module: str) -> str:
    parts = module.split(".")
    if len(parts) > 1 and (ROOT / parts[0] / parts[1]).is_dir():
        return ".".join(parts[:2])
    if parts[0] == "loadgen" and module not in ("loadgen.cli", "loadgen.__main__"):
        return "loadgen"
    return module


def _layer(group: str) -> int:
    for i, layer in enumerate(LAYERS):
        if group in layer:
            return i
    raise AssertionError(f"{group} is in no layer of {__name__}.LAYERS: place it there")


def test_no_import_cycles() -> None:
    cycles: list[str] = []
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(u: str) -> None:
        state[u] = 1
        stack.append(u)
        for v in sorted(GRAPH[u]):
            if state.get(v) == 1:
                cycles.append(" -> ".join([*stack[stack.index(v) :], v]))
            elif v not in state:
                visit(v)
        stack.pop()
        state[u] = 2

    for module in sorted(GRAPH):
        if module not in state:
            visit(module)
    assert not cycles, "import cycles:\n" + "\n".join(cycles)


@pytest.mark.parametrize("module", sorted(MODULES))
def test_imports_point_down_the_layers(module: str) -> None:
    mine = _group(module)
    wrong = [
        f"{module} ({mine}) imports {dep} ({_group(dep)})"
        for dep in sorted(GRAPH[module])
        if _group(dep) != mine and _layer(_group(dep)) >= _layer(mine)
    ]
    assert not wrong, "\n".join(wrong)


def test_job_packages_do_not_reach_tools() -> None:
    # What runs inside Spark never imports the chaos suite, local brokers, verify or loadgen.
    tools = ("ipcount.chaos", "ipcount.local", "ipcount.verify", "loadgen")
    wrong = [
        f"{m} imports {d}"
        for m in sorted(GRAPH)
        if _group(m) in JOB_PACKAGES
        for d in sorted(GRAPH[m])
        if d.startswith(tools)
    ]
    assert not wrong, "\n".join(wrong)


@pytest.mark.parametrize("module", sorted(MODULES))
def test_module_size(module: str) -> None:
    lines = len(MODULES[module].read_text(encoding="utf-8").splitlines())
    assert lines <= MAX_LINES, f"{MODULES[module]} has {lines} lines: split it by concern"


def test_every_module_declares_all() -> None:
    missing = [
        str(path.relative_to(ROOT))
        for name, path in MODULES.items()
        if not name.endswith("__main__")
        and path.name != "__init__.py"
        and path.name != "locustfile.py"
        and "__all__" not in path.read_text(encoding="utf-8")
    ]
    assert not missing, "modules without __all__: " + ", ".join(missing)


def test_no_function_runs_past_a_hundred_lines() -> None:
    long = [
        f"{MODULES[name].relative_to(ROOT)}::{node.name} ({node.end_lineno - node.lineno + 1})"
        for name in sorted(MODULES)
        for node in ast.walk(ast.parse(MODULES[name].read_text(encoding="utf-8")))
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
        and (node.end_lineno or node.lineno) - node.lineno + 1 > MAX_FUNCTION_LINES
    ]
    assert not long, "functions over 100 lines (split them into named steps): " + ", ".join(long)
