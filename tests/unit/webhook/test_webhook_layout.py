"""The webhook's place in the tree: importable as tessera.webhook, linted, and independent of the
test bed and of the other components (it ships alone, in its own image)."""

from __future__ import annotations

import ast
from pathlib import Path

REPO = Path(__file__).resolve().parents[3]
WEBHOOK = REPO / "webhook"


def imported_modules(path: Path) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
    return names


def test_the_webhook_imports_only_shared_helpers_and_itself() -> None:
    allowed = (
        "tessera.webhook",
        "tessera.names",
        "tessera.quantity",
        "tessera.watching",
        "tessera.kube",
        "tessera.logs",
        "tessera.settings",
    )
    for source in sorted(WEBHOOK.glob("*.py")):
        ours = {name for name in imported_modules(source) if name.startswith("tessera")}
        stray = {name for name in ours if name != "tessera" and not name.startswith(allowed)}
        assert not stray, f"{source.name} imports {sorted(stray)}"


def test_the_webhook_is_linked_into_the_import_root_and_linted() -> None:
    link = REPO / "tessera" / "webhook"
    assert link.is_symlink() and link.resolve() == WEBHOOK
    ruff_sources = next(
        line for line in (REPO / "Makefile").read_text().splitlines() if line.startswith("RUFF_SOURCES")
    )
    assert "webhook" in ruff_sources.split()
    assert 'tessera-webhook = "tessera.webhook.cli:main"' in (REPO / "pyproject.toml").read_text()
