"""The map is the territory: every file or module that README.md and docs/*.md name (in a code span
or a table) exists, as the docs name it (`kafka/topic_reader.py` for ipcount/kafka/topic_reader.py,
a bare `reader.py` after `ipcount/source/` in the same table cell or line, `python -m
ipcount.bench.timed_job`), and every module of ipcount/ and loadgen/ has its place in the file table
of docs/architecture.md."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

import pytest

ROOT = Path(__file__).resolve().parents[2]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
ARCHITECTURE = ROOT / "docs" / "architecture.md"
PACKAGES = ("ipcount", "loadgen")
# Named by the docs but not in this repository, each with why; a test below keeps the list honest.
OUTSIDE_REPO: dict[str, str] = {}

_FENCE = re.compile(r"^(```|~~~)")
_SPAN = re.compile(r"`([^`\n]+)`")
_TABLE_WORD = re.compile(r"(?<![\w./`-])([\w.-]+(?:/[\w.-]+)*/?)")
_PY_NAME = re.compile(r"\w+\.py")
_DOTTED = re.compile(r"(?:ipcount|loadgen)(?:\.\w+)+")
# Where a relative path in the docs may start: the repository root, or a top-level package
# (`kafka/topic_reader.py`, `bench/job_launcher.py`).
_BASES = (ROOT, *(ROOT / p for p in PACKAGES))


@dataclass
class Named:
    """What a page names: the files it names that are missing, and those that exist."""

    missing: list[str] = field(default_factory=list)
    found: set[Path] = field(default_factory=set)


def _repo_tops() -> set[str]:
    """First components a relative path of this repository may start with."""
    tops = {p.name for p in ROOT.iterdir() if not p.name.startswith(".") or p.name == ".ci"}
    for base in _BASES[1:]:
        tops |= {p.name for p in base.iterdir() if p.is_dir() and (p / "__init__.py").is_file()}
    return tops - {".venv", "__pycache__"}


def _words(line: str, in_table: bool) -> list[str]:
    """The words of a line that may be paths: in its code spans, and anywhere in a table row."""
    words = [w for m in _SPAN.finditer(line) for w in m.group(1).split()]
    if in_table:
        words += [m.group(1) for m in _TABLE_WORD.finditer(_SPAN.sub(" ", line))]
    return [w.strip(",;:()[]'\"") for w in words]


def _resolve_dotted(name: str) -> Path | Literal[False] | None:
    """ipcount.x.y[.attr] -> the module's file; None if it is not there; False if the name is not
    a module path at all (a header such as `ipcount.original.size`)."""
    top, *rest = name.split(".")
    here = ROOT / top
    if not rest or not ((here / rest[0]).is_dir() or (here / f"{rest[0]}.py").is_file()):
        return False
    for i, part in enumerate(rest):
        if (here / part / "__init__.py").is_file():
            here = here / part
        elif (here / f"{part}.py").is_file():
            module = here / f"{part}.py"
            attrs = rest[i + 1 :]
            if not attrs:
                return module
            text = module.read_text(encoding="utf-8")
            defined = re.search(rf"^(?:def|class) {attrs[0]}\b|^{attrs[0]}\b.*=", text, re.M)
            return module if len(attrs) == 1 and defined else None
        else:
            init = here / "__init__.py"
            text = init.read_text(encoding="utf-8") if init.is_file() else ""
            return init if i == len(rest) - 1 and re.search(rf"\b{part}\b", text) else None
    return here / "__init__.py"


def _check_word(
    word: str, context: Path | None, strict: bool, tops: set[str], page_dir: Path
) -> Path | Literal[False] | None:
    """The file or directory `word` names, None if missing, False if it is no path of ours."""
    if not word or word[0] in "/~$<-" or any(c in word for c in ":<>=@?*{}"):
        return False
    if _DOTTED.fullmatch(word):
        return _resolve_dotted(word)
    if word.startswith("../"):  # relative to the page, like a link
        target = (page_dir / word).resolve()
        return target if target.is_relative_to(ROOT) and target.exists() else None
    bare = word.rstrip("/")
    if "/" not in word:
        if not _PY_NAME.fullmatch(bare):
            return False
        if context is not None and (context / bare).is_file():
            return context / bare
        if context is not None and strict:
            return None
        hits = [p for top in PACKAGES for p in (ROOT / top).rglob(bare)]
        return hits[0] if hits else None
    if bare.split("/")[0] not in tops and not bare.endswith(".py"):
        return False  # `records/s`, `runs/serve.jsonl`: not a path of this repository
    for base in (context, *_BASES) if context is not None else _BASES:
        if base is not None and (base / bare).exists():
            return base / bare
    return None


def named_paths(text: str, where: str, page_dir: Path = ROOT / "docs") -> Named:
    """Check every path `text` (a Markdown page in `page_dir`) names; `where` prefixes the
    messages."""
    named, tops, fenced = Named(), _repo_tops(), False
    for number, line in enumerate(text.splitlines(), 1):
        if _FENCE.match(line.lstrip()):
            fenced = not fenced
        if fenced or _FENCE.match(line.lstrip()):
            continue
        in_table = line.lstrip().startswith("|")
        for cell in line.split("|") if in_table else [line]:
            context: Path | None = None
            for word in _words(cell, in_table):
                if word in OUTSIDE_REPO:
                    continue
                hit = _check_word(word, context, in_table, tops, page_dir)
                if hit is None:
                    after = ""
                    if context is not None and "/" not in word:  # a bare name, looked up there
                        after = f" (in {context.relative_to(ROOT)}/)"
                    named.missing.append(f"{where}:{number}: {word}{after}")
                elif hit is not False:
                    named.found.add(hit)
                    if hit.is_dir():
                        context = hit
    return named


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_path_the_docs_name_exists(page: Path) -> None:
    named = named_paths(page.read_text(encoding="utf-8"), str(page.relative_to(ROOT)), page.parent)
    assert not named.missing, "named in the docs but not in the repository:\n" + "\n".join(
        named.missing
    )


def test_every_module_has_its_place_in_the_architecture_table() -> None:
    tables = "\n".join(
        line
        for line in ARCHITECTURE.read_text(encoding="utf-8").splitlines()
        if line.lstrip().startswith("|")
    )
    found = named_paths(tables, "docs/architecture.md").found
    modules = sorted(
        p.relative_to(ROOT)
        for top in PACKAGES
        for p in (ROOT / top).rglob("*.py")
        if p.name != "__init__.py" and "__pycache__" not in p.parts
    )
    absent = [str(m) for m in modules if ROOT / m not in found]
    assert not absent, (
        "modules docs/architecture.md's file table does not name (add each to its part's row, "
        "with what it does):\n" + "\n".join(absent)
    )


def test_a_made_up_path_is_reported() -> None:
    page = (
        "The reader lives in `ipcount/kafka/consume.py`; run `python -m ipcount.bench.nowhere`.\n"
        "| part | where |\n|---|---|\n"
        "| Kafka | `ipcount/kafka/` (`client.py`, `topics.py`, `consume.py`), `chaos/job.py` |\n"
        "A real one: `kafka/topic_reader.py`; not a path: `records/s`, `job.restart_attempts`.\n"
    )
    named = named_paths(page, "page.md")
    assert named.missing == [
        "page.md:1: ipcount/kafka/consume.py",
        "page.md:1: ipcount.bench.nowhere",
        "page.md:4: consume.py (in ipcount/kafka/)",
        "page.md:4: chaos/job.py",
    ]
    assert ROOT / "ipcount" / "kafka" / "client.py" in named.found
    assert ROOT / "ipcount" / "kafka" / "topic_reader.py" in named.found


def test_the_paths_outside_the_repository_are_still_named() -> None:
    # An entry stays only while a page still names it: remove it when the docs stop.
    text = "\n".join(p.read_text(encoding="utf-8") for p in PAGES)
    stale = [path for path in OUTSIDE_REPO if path not in text]
    assert not stale, f"no page names {stale} any more: remove them from OUTSIDE_REPO"
