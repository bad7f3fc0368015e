"""docs/threat-model.md names, for each attack, the test that proves what stops it: every test
function and test file it names exists, and every row of its tables names at least one, so the page
cannot keep citing a proof that was renamed or removed."""

from __future__ import annotations

import re

from tests.unit.docs.docs_pages import REPO

PAGE = REPO / "docs" / "threat-model.md"
TEST_FUNCTION = re.compile(r"\btest_[a-z0-9_]+\b(?![.*])")
"""A test function's name: one followed by ``.py`` (or a ``*`` pattern) is a file's."""
TEST_FILE = re.compile(r"\b(test_[a-z0-9_]+)(\.py|\*\.py)")


def _attack_rows() -> list[list[str]]:
    """The cells of every table row but headers and rules."""
    rows = [line for line in PAGE.read_text().splitlines() if line.startswith("|")]
    return [
        [cell.strip() for cell in row.strip("|").split("|")]
        for row in rows
        if not set(row) <= set("|- ") and not row.startswith("| attack |")
    ]


def test_every_test_the_page_names_exists() -> None:
    text = PAGE.read_text()
    test_files = list((REPO / "tests").rglob("test_*.py"))
    defined: set[str] = set()
    for path in test_files:
        defined.update(re.findall(r"^(?:async )?def (test_[a-z0-9_]+)\(", path.read_text(), re.M))
    missing = sorted(set(TEST_FUNCTION.findall(text)) - defined)
    assert not missing, f"docs/threat-model.md names test functions that do not exist: {missing}"
    stems = {path.stem for path in test_files}
    for stem, suffix in TEST_FILE.findall(text):
        found = any(s.startswith(stem) for s in stems) if suffix.startswith("*") else stem in stems
        assert found, f"docs/threat-model.md names {stem}{suffix}, which is no test file"


def test_every_attack_row_names_its_proof() -> None:
    rows = _attack_rows()
    assert len(rows) >= 15, "the page's tables lost their rows"
    unproved = [cells[0] for cells in rows if not re.search(r"\btest_[a-z0-9_]+", cells[-1])]
    assert not unproved, f"attacks with no test named in their last column: {unproved}"
