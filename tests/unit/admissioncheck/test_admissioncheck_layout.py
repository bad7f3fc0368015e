"""The admission check's place in the tree: importable as tessera.admissioncheck, linted, a console
entry point, and independent of the test bed; of the webhook it uses only the pure conversion."""

from __future__ import annotations

import ast
from pathlib import Path

REPO = Path(__file__).resolve().parents[3]
PACKAGE = REPO / "admissioncheck"


def imported_modules(path: Path) -> set[str]:
    tree = ast.parse(path.read_text())
    plain = {alias.name for node in ast.walk(tree) if isinstance(node, ast.Import) for alias in node.names}
    return plain | {
        node.module for node in ast.walk(tree) if isinstance(node, ast.ImportFrom) and node.module
    }


def test_the_admission_check_imports_shared_helpers_and_the_webhooks_pure_conversion_only() -> None:
    allowed = (
        "tessera.admissioncheck",
        "tessera.names",
        "tessera.quantity",
        "tessera.watching",
        "tessera.kube",
        "tessera.logs",
        "tessera.settings",
        "tessera.webhook.conversion",
        "tessera.webhook.selectors",
    )
    for source in sorted(PACKAGE.glob("*.py")):
        ours = {name for name in imported_modules(source) if name.startswith("tessera")}
        stray = {name for name in ours if name != "tessera" and not name.startswith(allowed)}
        assert not stray, f"{source.name} imports {sorted(stray)}"


def test_fit_is_pure() -> None:
    imports = imported_modules(PACKAGE / "fit.py")
    assert not {name for name in imports if name.startswith(("kubernetes", "threading", "socket", "http"))}


def test_the_admission_check_is_linked_into_the_import_root_linted_and_installed() -> None:
    link = REPO / "tessera" / "admissioncheck"
    assert link.is_symlink() and link.resolve() == PACKAGE
    ruff_sources = next(
        line for line in (REPO / "Makefile").read_text().splitlines() if line.startswith("RUFF_SOURCES")
    )
    assert "admissioncheck" in ruff_sources.split()
    assert (
        'tessera-admission-check = "tessera.admissioncheck.cli:main"' in (REPO / "pyproject.toml").read_text()
    )
