"""Constraints files read: the one exact version of each distribution an environment installs -
constraints.txt for make venv and the images, dev/clients-cuda13/constraints.txt for the CUDA 13
client venv."""

from __future__ import annotations

from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import NormalizedName, canonicalize_name
from packaging.version import Version

from tests.unit.layout.layout_facts import REPO

CONSTRAINTS = REPO / "constraints.txt"
CUDA13_CLIENTS = REPO / "dev" / "clients-cuda13"


def pins(constraints: Path = CONSTRAINTS) -> dict[NormalizedName, Version]:
    """A constraints file: one ``name==version`` a line, beside comments."""
    found: dict[NormalizedName, Version] = {}
    for line in constraints.read_text().splitlines():
        if not line.strip() or line.startswith("#"):
            continue
        requirement = Requirement(line)
        [specifier] = requirement.specifier
        assert specifier.operator == "==" and not requirement.marker and not requirement.extras, line
        name = canonicalize_name(requirement.name)
        assert name not in found, f"{name} pinned twice"
        found[name] = Version(specifier.version)
    return found
