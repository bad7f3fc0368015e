"""Facts about the tree for the layout tests: which modules a file imports, which part a module
belongs to, and what each distribution installs. Read from the source with ``ast`` and ``tomllib``,
never by importing the parts, so a layout mistake cannot hide behind an import error."""

from __future__ import annotations

import ast
import tomllib
from collections.abc import Iterator
from pathlib import Path

REPO = Path(__file__).resolve().parents[3]
PRODUCT = REPO / "tessera"

PARTS = ("driver", "exporter", "webhook", "admissioncheck", "kubectl", "webview", "shim", "proto")
"""The product's parts: each a folder of tessera/, one thing a user can name."""
CORE = "core"
"""What the modules directly in tessera/ are called here: the shared core every part may use."""
DEVELOPMENT = ("testbed", "simgpu", "demo", "tools", "tests", "benchmarks")
"""Top-level packages of the development tree (dev/pyproject.toml, and the checks): never shipped."""


def imported_modules(path: Path) -> set[str]:
    """Every module a Python file imports, by its full dotted name (relative imports resolved)."""
    package = ".".join(path.relative_to(REPO).with_suffix("").parts[:-1])
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
                module = f"{base}.{node.module}" if node.module else base
            elif node.module:
                module = node.module
            else:
                continue
            names.update(_submodule_or_package(module, alias.name) for alias in node.names)
    return names


def _submodule_or_package(package: str, name: str) -> str:
    """``from package import name``: the module it loads, ``package.name`` when that is a module of
    the tree, else ``package`` itself (the name is an attribute of it)."""
    path = REPO.joinpath(*package.split("."), name)
    return f"{package}.{name}" if path.with_suffix(".py").exists() or path.is_dir() else package


def part_of(module: str) -> str | None:
    """The part a ``tessera.*`` module belongs to (:data:`CORE` for the shared modules), or None for
    anything outside the product."""
    pieces = module.split(".")
    if pieces[0] != "tessera":
        return None
    if len(pieces) > 1 and pieces[1] in PARTS:
        return pieces[1]
    return CORE


def product_files(part: str) -> Iterator[Path]:
    """The Python files of one part (generated gRPC stubs left out: protoc writes them)."""
    files = PRODUCT.glob("*.py") if part == CORE else (PRODUCT / part).rglob("*.py")
    yield from (path for path in sorted(files) if not path.name.endswith(("_pb2.py", "_pb2_grpc.py")))


def imports_outside(part: str, allowed: set[str]) -> dict[str, list[str]]:
    """The files of ``part`` that import product modules of parts other than ``allowed`` (its own
    part is always allowed), or any development package; each with those modules."""
    stray: dict[str, list[str]] = {}
    for path in product_files(part):
        bad = sorted(
            name
            for name in imported_modules(path)
            if name.split(".")[0] in DEVELOPMENT
            or (part_of(name) is not None and part_of(name) not in {part, *allowed})
        )
        if bad:
            stray[str(path.relative_to(REPO))] = bad
    return stray


def scripts(pyproject: Path) -> dict[str, str]:
    """The commands a distribution installs, each with the function it runs."""
    return dict(tomllib.loads(pyproject.read_text())["project"].get("scripts", {}))
