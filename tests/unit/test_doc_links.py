"""Every relative link in the documentation resolves: its file exists, its #anchor (if any) is a heading.

Container-free: reads Markdown files. Covers README.md, docs/*.md, every role's README and the other READMEs
of the tree (molecule, bench, inventories, test doubles, the package). Links with a scheme (https:, mailto:)
are not followed. Anchors are GitHub's: a heading's text, lower-cased, punctuation but `-` and `_` dropped,
spaces as `-`, a repeated heading numbered (`-1`, `-2`).
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
DOCUMENTS = sorted(
    {
        REPO / "README.md",
        *REPO.glob("docs/*.md"),
        *REPO.glob("roles/*/README.md"),
        *REPO.glob("inventories/*/README.md"),
        *(REPO / name for name in ("molecule/README.md", "bench/README.md", "tests/doubles/README.md")),
        REPO / "python/README.md",
    }
)
FENCE = re.compile(r"^(```|~~~).*?^\1[^\n]*$", re.MULTILINE | re.DOTALL)
CODE_SPAN = re.compile(r"(`+)(?:(?!\1).)+?\1", re.DOTALL)
# [text](target) or [text](target "title"); an image's ![alt](src) is a link too.
LINK = re.compile(r"\[[^\]]*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
HEADING = re.compile(r"^ {0,3}(#{1,6})\s+(.*?)\s*#*\s*$", re.MULTILINE)
SCHEME = re.compile(r"^[a-zA-Z][a-zA-Z0-9+.-]*:")


def prose(text: str) -> str:
    """The text without fenced code blocks and code spans, where brackets are not links."""
    return CODE_SPAN.sub("", FENCE.sub("", text))


def slug(heading: str) -> str:
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link in a heading keeps its text
    text = text.replace("`", "").strip().lower()
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def anchors(path: Path) -> set[str]:
    seen: dict[str, int] = {}
    found = set()
    for match in HEADING.finditer(FENCE.sub("", path.read_text(encoding="utf-8"))):
        base = slug(match[2])
        count = seen.get(base, 0)
        seen[base] = count + 1
        found.add(base if count == 0 else f"{base}-{count}")
    return found


def links(path: Path) -> Iterator[str]:
    for line in prose(path.read_text(encoding="utf-8")).splitlines():
        for match in LINK.finditer(line):
            target = match[1]
            if not SCHEME.match(target):
                yield target


def broken(path: Path, root: Path = REPO) -> list[str]:
    """One line per link of PATH whose file or anchor is not there."""
    problems = []
    for target in links(path):
        file_part, _, anchor = target.partition("#")
        resolved = (path.parent / file_part).resolve() if file_part else path
        name = f"{path.relative_to(root)}: ({target})"
        if not resolved.exists():
            problems.append(f"{name}: no such file")
        elif anchor and resolved.suffix == ".md" and anchor not in anchors(resolved):
            problems.append(f"{name}: no heading with anchor #{anchor}")
    return problems


@pytest.mark.parametrize("path", DOCUMENTS, ids=lambda path: str(path.relative_to(REPO)))
def test_every_relative_link_resolves(path: Path) -> None:
    assert path.is_file(), f"{path.relative_to(REPO)} is missing"
    problems = broken(path)
    assert problems == [], "\n".join(problems)


def test_the_checker_finds_a_missing_file_and_anchor_and_skips_code(tmp_path: Path) -> None:
    (tmp_path / "other.md").write_text(
        "# Other\n\n## The gate (check.yml)\n\n## Same\n\n## Same\n", encoding="utf-8"
    )
    doc = tmp_path / "doc.md"
    doc.write_text(
        "[ok](other.md#the-gate-checkyml) [second](other.md#same-1) [web](https://example.com/x)\n"
        "[gone](missing.md) [bad anchor](other.md#nowhere) `[code](nowhere.md)`\n"
        "```\n[fenced](nowhere.md)\n```\n",
        encoding="utf-8",
    )
    assert anchors(tmp_path / "other.md") == {"other", "the-gate-checkyml", "same", "same-1"}
    assert list(links(doc)) == [
        "other.md#the-gate-checkyml",
        "other.md#same-1",
        "missing.md",
        "other.md#nowhere",
    ]
    assert broken(doc, root=tmp_path) == [
        "doc.md: (missing.md): no such file",
        "doc.md: (other.md#nowhere): no heading with anchor #nowhere",
    ]
