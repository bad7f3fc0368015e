"""The pages the docs tests read, and how they split a Markdown page into prose and fenced blocks."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[3]


def pages() -> list[Path]:
    """README.md, every page under docs/, and the examples' README (the docs link to it as a page)."""
    return [REPO / "README.md", *sorted((REPO / "docs").rglob("*.md")), REPO / "examples" / "README.md"]


def page_id(path: Path) -> str:
    return str(path.relative_to(REPO))


@dataclass(frozen=True)
class Fence:
    page: Path
    line: int
    """1-based line of the opening fence."""
    language: str
    body: str


FENCE = re.compile(r"^(\s*)(`{3,}|~{3,})\s*([^\s`]*)")


def split(text: str) -> tuple[str, list[Fence]]:
    """(the page with every fenced block blanked out, the fenced blocks), for a page's text."""
    prose: list[str] = []
    fences: list[tuple[int, str, list[str]]] = []
    current: tuple[int, str, list[str]] | None = None
    marker = ""
    for number, line in enumerate(text.splitlines(), start=1):
        match = FENCE.match(line)
        if current is None and match:
            marker = match.group(2)
            current = (number, match.group(3), [])
            prose.append("")
        elif current is not None and line.strip().startswith(marker) and not line.strip().strip(marker[0]):
            fences.append(current)
            current = None
            prose.append("")
        elif current is not None:
            current[2].append(line)
            prose.append("")
        else:
            prose.append(line)
    return "\n".join(prose), [(Fence(Path(), n, lang, "\n".join(body))) for n, lang, body in fences]


def fences_of(path: Path) -> list[Fence]:
    _, fences = split(path.read_text())
    return [Fence(path, f.line, f.language, f.body) for f in fences]
