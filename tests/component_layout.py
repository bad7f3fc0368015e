"""Facts about a component's place in the tree, for the layout tests of the components that ship
alone (the webhook, the admission check): which tessera modules each of its files imports, whether
it is linked into the tessera/ import root and linted, and the console scripts the package installs.
"""

from __future__ import annotations

import ast
import tomllib
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def imported_modules(path: Path) -> set[str]:
    """Every module a Python file imports, by its full dotted name."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
    return names


def stray_imports(folder: str, allowed: tuple[str, ...]) -> dict[str, list[str]]:
    """The files of a top-level folder that import tessera modules other than ``allowed`` (and
    their prefixes' submodules), each with those modules: empty when the folder keeps to them."""
    stray: dict[str, list[str]] = {}
    for source in sorted((REPO / folder).glob("*.py")):
        ours = {name for name in imported_modules(source) if name.startswith("tessera.")}
        outside = sorted(name for name in ours if not name.startswith(allowed))
        if outside:
            stray[source.name] = outside
    return stray


def linked_into_import_root(folder: str) -> bool:
    """Whether tessera/<folder> is the link that makes the folder importable as tessera.<folder>."""
    link = REPO / "tessera" / folder
    return link.is_symlink() and link.resolve() == REPO / folder


def linted(folder: str) -> bool:
    """Whether `make lint` gives the folder to ruff (which does not follow the tessera/ links)."""
    makefile = (REPO / "Makefile").read_text().splitlines()
    return folder in next(line for line in makefile if line.startswith("RUFF_SOURCES")).split()


def console_scripts() -> dict[str, str]:
    """The commands the package installs, each with the function it runs."""
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    return dict(project["scripts"])
