"""No link in the README or the docs points outside the repository: every link is relative, names a
file or folder that exists in the repository, and every #anchor names a heading of its page."""

from __future__ import annotations

import re
from functools import cache
from pathlib import Path

import pytest

from tests.unit.docs.docs_pages import REPO, page_id, pages, split

INLINE = re.compile(r"!?\[(?:[^\[\]]|\[[^\]]*\])*\]\(\s*(<[^>]*>|[^)\s]+)(?:\s+\"[^\"]*\")?\s*\)")
REFERENCE = re.compile(r"^\s{0,3}\[[^\]]+\]:\s*(<[^>]*>|\S+)", re.M)
AUTOLINK = re.compile(r"<([a-zA-Z][a-zA-Z0-9+.-]*:[^>\s]*)>")
BARE = re.compile(r"(?<![\w/])(?:https?://|ftp://|www\.)[^\s)>\]]+")
SCHEME = re.compile(r"^[a-zA-Z][a-zA-Z0-9+.-]*:")


def _prose(page: str) -> str:
    """The page without fenced blocks and inline code, where nothing is a link."""
    text, _ = split(page)
    return re.sub(r"(`+)(?:(?!\1).)+?\1", "", text, flags=re.S)


def links(page: str) -> list[str]:
    text = _prose(page)
    found = [m.group(1).strip("<>") for m in INLINE.finditer(text)]
    found += [m.group(1).strip("<>") for m in REFERENCE.finditer(text)]
    found += [m.group(1) for m in AUTOLINK.finditer(text)]
    found += [m.group(0) for m in BARE.finditer(text)]
    return list(dict.fromkeys(found))


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: its text, lower case, punctuation dropped, spaces as hyphens."""
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", heading.strip())
    text = re.sub(r"<[^>]+>", "", text).lower()
    text = "".join(c for c in text if c.isalnum() or c in " -_")
    return text.replace(" ", "-")


@cache
def anchors(path: Path) -> frozenset[str]:
    text, _ = split(path.read_text())
    seen: dict[str, int] = {}
    out = set()
    for match in re.finditer(r"^#{1,6}\s+(.*?)\s*#*\s*$", text, re.M):
        base = slug(match.group(1))
        count = seen.get(base, 0)
        seen[base] = count + 1
        out.add(base if count == 0 else f"{base}-{count}")
    return frozenset(out)


def problems(path: Path, text: str | None = None) -> list[str]:
    """What is wrong with the links of the page at ``path`` (whose text is ``text`` if given)."""
    out = []
    for target in links(path.read_text() if text is None else text):
        if SCHEME.match(target) or BARE.match(target):
            out.append(f"{target}: points outside the repository")
            continue
        file_part, _, anchor = target.partition("#")
        destination = (path.parent / file_part).resolve() if file_part else path
        if not destination.is_relative_to(REPO):
            out.append(f"{target}: leaves the repository")
        elif not destination.exists():
            out.append(f"{target}: no such file in the repository")
        elif anchor:
            if destination.suffix != ".md":
                out.append(f"{target}: an anchor into a file that is not a Markdown page")
            elif anchor not in anchors(destination):
                out.append(f"{target}: {page_id(destination)} has no heading with anchor #{anchor}")
    return out


@pytest.mark.parametrize("path", pages(), ids=page_id)
def test_every_link_stays_in_the_repository_and_resolves(path: Path) -> None:
    assert not problems(path), f"{page_id(path)}:\n" + "\n".join(problems(path))


def test_the_checker_catches_what_it_should() -> None:
    page = REPO / "docs" / "getting-started.md"
    assert anchors(page) >= {"what-you-need", "check-that-it-works", "uninstall"}
    assert slug("The shim's environment") == "the-shims-environment"
    assert slug("The request policy, and what it means for scheduling") == (
        "the-request-policy-and-what-it-means-for-scheduling"
    )
    found = problems(
        REPO / "docs" / "sample.md",
        "# Title\n[a](https://example.com) [b](missing.md) [c](install.md#no-such-heading)\n"
        "[d](getting-started.md#uninstall) [e](../README.md) see www.example.com and <mailto:x@example.com>\n"
        "`[not a link](http://x)`\n```sh\ncurl http://in-a-block\n```\n",
    )
    assert len(found) == 5, found
    assert any("https://example.com" in p for p in found)
    assert any("missing.md" in p for p in found)
    assert any("no-such-heading" in p for p in found)
    assert any("www.example.com" in p for p in found)
    assert any("mailto:" in p for p in found)


def test_the_readme_lists_every_page_of_the_docs() -> None:
    readme = (REPO / "README.md").read_text()
    listed = {target.partition("#")[0] for target in links(readme)}
    missing = [page_id(p) for p in sorted((REPO / "docs").rglob("*.md")) if page_id(p) not in listed]
    assert not missing, f"README.md does not link to {missing}: add them to its Documentation table"
