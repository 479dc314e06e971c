"""The README is the front door: short, the two set-up commands as they are, a link to every page
of docs/; every relative link and #anchor in README.md and docs/*.md leads somewhere, and every
file (and test) of this repository they name exists."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
DOCS = sorted((ROOT / "docs").glob("*.md"))
PAGES = [README, *DOCS]
README_MAX_LINES = 300
SETUP_BLOCK = (
    "```bash\n"
    "python3 -m venv .venv && .venv/bin/pip install -e '.[dev]' && .venv/bin/ipcount demo\n"
    ".ci/run\n"
    "```\n"
)

_FENCE = re.compile(r"^(```|~~~)")
_LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")
# A path of this repository (and a test in it, after ::) as the docs name it.
_REPO_PATH = re.compile(
    r"(?<![\w./~$-])((?:ipcount|loadgen|tests|conf|docs|\.ci)/[\w./-]*\w)(::\w+)?"
)
_CODE_SPAN = re.compile(r"`+(?:[^`\n]|\n(?!\n))*`+")  # within a paragraph


def _prose_lines(page: Path) -> list[tuple[int, str]]:
    """(line number, text) of the lines outside fenced code blocks."""
    out: list[tuple[int, str]] = []
    fenced = False
    for number, line in enumerate(page.read_text(encoding="utf-8").splitlines(), 1):
        if _FENCE.match(line.lstrip()):
            fenced = not fenced
            continue
        if not fenced:
            out.append((number, line))
    return out


def _anchors(page: Path) -> set[str]:
    """The anchors GitHub gives the page's headings: lower case, punctuation dropped, spaces as
    hyphens, a repeated one suffixed -1, -2, ..."""
    seen: dict[str, int] = {}
    anchors: set[str] = set()
    for _, line in _prose_lines(page):
        heading = re.match(r"#{1,6}\s+(.*?)\s*#*\s*$", line)
        if not heading:
            continue
        slug = re.sub(r"[^\w\- ]", "", heading.group(1).lower()).replace(" ", "-")
        count = seen.get(slug, 0)
        seen[slug] = count + 1
        anchors.add(slug if count == 0 else f"{slug}-{count}")
    return anchors


def _links(page: Path) -> list[tuple[int, str]]:
    """(line number, target) of every link and image in the page's prose, code spans left out;
    a link's text may run over a line break."""
    prose = dict(_prose_lines(page))
    lines = [prose.get(n, "") for n in range(1, max(prose, default=0) + 1)]
    text = _CODE_SPAN.sub(lambda m: re.sub(r"[^\n]", " ", m.group()), "\n".join(lines))
    return [(text.count("\n", 0, m.start()) + 1, m.group(1)) for m in _LINK.finditer(text)]


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_link_resolves(page: Path) -> None:
    broken: list[str] = []
    for number, target in _links(page):
        if re.match(r"[a-z][a-z0-9+.-]*:", target):  # https:, mailto: ...: not ours to check
            continue
        path_part, _, anchor = target.partition("#")
        dest = (page.parent / path_part).resolve() if path_part else page
        where = f"{page.relative_to(ROOT)}:{number}: {target}"
        if not dest.exists():
            broken.append(f"{where}: no such file")
        elif anchor and (dest.suffix != ".md" or anchor not in _anchors(dest)):
            broken.append(f"{where}: no heading with anchor #{anchor} in {dest.name}")
    assert not broken, "broken links:\n" + "\n".join(broken)


def test_readme_is_a_front_door() -> None:
    text = README.read_text(encoding="utf-8")
    lines = len(text.splitlines())
    assert lines <= README_MAX_LINES, f"README.md has {lines} lines: move reference to docs/"
    assert SETUP_BLOCK in text, "README.md must keep the two set-up commands exactly"
    assert text.index(SETUP_BLOCK) < text.index("\n## "), "the set-up commands come first"


def test_readme_links_every_docs_page() -> None:
    assert DOCS, "docs/ has no pages"
    linked = {
        (ROOT / target.partition("#")[0]).resolve()
        for _, target in _links(README)
        if target.startswith("docs/")
    }
    unlinked = [str(p.relative_to(ROOT)) for p in DOCS if p.resolve() not in linked]
    assert not unlinked, "docs pages the README does not link: " + ", ".join(unlinked)


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_file_named_exists(page: Path) -> None:
    # A path of this repository named in the text or a command (a module, a test, a conf file),
    # and a test named with ::, must be there: the docs move with the code.
    missing: list[str] = []
    for number, line in enumerate(page.read_text(encoding="utf-8").splitlines(), 1):
        for m in _REPO_PATH.finditer(line):
            path, test = ROOT / m.group(1), m.group(2)
            if not path.exists():
                missing.append(f"{page.relative_to(ROOT)}:{number}: {m.group(1)}")
            elif test and f"def {test[2:]}(" not in path.read_text(encoding="utf-8"):
                missing.append(f"{page.relative_to(ROOT)}:{number}: {m.group()}")
    assert not missing, "named but not there:\n" + "\n".join(missing)
