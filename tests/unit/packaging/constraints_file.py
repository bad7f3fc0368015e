"""constraints.txt read: the one exact version of each distribution make venv and the images install."""

from __future__ import annotations

from packaging.requirements import Requirement
from packaging.utils import NormalizedName, canonicalize_name
from packaging.version import Version

from tests.unit.layout.layout_facts import REPO

CONSTRAINTS = REPO / "constraints.txt"


def pins() -> dict[NormalizedName, Version]:
    """constraints.txt: one ``name==version`` a line, beside comments."""
    found: dict[NormalizedName, Version] = {}
    for line in CONSTRAINTS.read_text().splitlines():
        if not line.strip() or line.startswith("#"):
            continue
        requirement = Requirement(line)
        [specifier] = requirement.specifier
        assert specifier.operator == "==" and not requirement.marker and not requirement.extras, line
        name = canonicalize_name(requirement.name)
        assert name not in found, f"{name} pinned twice"
        found[name] = Version(specifier.version)
    return found
