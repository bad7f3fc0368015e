"""Ranges where the ecosystem reads them, exact versions in one file: pyproject.toml and
dev/pyproject.toml declare what Tessera and its development tree need as ranges; constraints.txt pins
one version of everything installed (make venv, so CI, and both images install from it). These tests
fail when a requirement is added without a pin, when a pin leaves its range, and when this environment
was not installed from the pins."""

from __future__ import annotations

import importlib.metadata
import tomllib

import pytest
from packaging.requirements import Requirement
from packaging.utils import NormalizedName, canonicalize_name
from packaging.version import Version

from tests.unit.layout.layout_facts import REPO
from tests.unit.packaging.constraints_file import CUDA13_CLIENTS, pins

PRODUCT = tomllib.loads((REPO / "pyproject.toml").read_text())
DEVELOPMENT = tomllib.loads((REPO / "dev" / "pyproject.toml").read_text())
# The editable installs of the repository itself: installed from the tree, never pinned.
OWN = {canonicalize_name(PRODUCT["project"]["name"]), canonicalize_name(DEVELOPMENT["project"]["name"])}


def declared() -> list[Requirement]:
    """Every requirement the repository declares: the product's, the development distribution's and
    the product's build requirements."""
    lines = [
        *PRODUCT["project"]["dependencies"],
        *DEVELOPMENT["project"]["dependencies"],
        *PRODUCT["build-system"]["requires"],
    ]
    return [Requirement(line) for line in lines]


def test_the_product_declares_ranges_and_no_development_extra() -> None:
    """A user's resolver may choose within each range; the checkers are not the product's."""
    for line in PRODUCT["project"]["dependencies"]:
        specifiers = Requirement(line).specifier
        assert {s.operator for s in specifiers} == {">=", "<"}, line
    assert "optional-dependencies" not in PRODUCT["project"]


@pytest.mark.parametrize("requirement", declared(), ids=str)
def test_every_declared_requirement_is_pinned_inside_its_range(requirement: Requirement) -> None:
    pinned = pins()
    name = canonicalize_name(requirement.name)
    assert name in pinned, f"{requirement} has no pin in constraints.txt"
    assert requirement.specifier.contains(pinned[name], prereleases=True), f"{name}=={pinned[name]}"


def test_grpcio_tools_is_one_exact_version_for_the_build_and_the_drift_test() -> None:
    """The stubs a build generates and those tests/unit/proto regenerates come from one generator."""
    tools = [r for r in declared() if canonicalize_name(r.name) == "grpcio-tools"]
    assert len(tools) == 2
    assert {str(r.specifier) for r in tools} == {f"=={pins()[canonicalize_name('grpcio-tools')]}"}


def installed_closure() -> dict[NormalizedName, Version]:
    """The distributions this environment holds because the repository asked for them: the two
    editable installs' requirements, and theirs, followed through their installed metadata (markers
    evaluated here, no extras)."""
    found: dict[NormalizedName, Version] = {}
    pending = [*OWN]
    while pending:
        distribution = importlib.metadata.distribution(pending.pop())
        for line in distribution.requires or []:
            requirement = Requirement(line)
            if requirement.marker and not requirement.marker.evaluate({"extra": ""}):
                continue
            name = canonicalize_name(requirement.name)
            if name not in found and name not in OWN:
                found[name] = Version(importlib.metadata.version(name))
                pending.append(name)
    return found


def test_this_environment_holds_the_pinned_version_of_everything_it_was_asked_for() -> None:
    """make venv installs with --constraint constraints.txt: anything a requirement pulls in that is
    not pinned, or not at its pin, means the file or the environment is out of date (make venv)."""
    pinned = pins()
    closure = installed_closure()
    assert {"kubernetes", "pytest", "protobuf", "urllib3"} <= set(closure)
    assert sorted(set(closure) - set(pinned)) == [], "installed but not pinned"
    assert {name: version for name, version in closure.items() if pinned[name] != version} == {}


def cuda13_requirements() -> list[Requirement]:
    """What the CUDA 13 client venv is asked for (dev/clients-cuda13/requirements.txt)."""
    lines = (CUDA13_CLIENTS / "requirements.txt").read_text().splitlines()
    return [Requirement(line) for line in lines if line.strip() and not line.startswith("#")]


@pytest.mark.parametrize("requirement", cuda13_requirements(), ids=str)
def test_every_cuda13_client_requirement_is_a_range_pinned_inside_it(requirement: Requirement) -> None:
    """The CUDA 13 client venv follows the same rule as the development environment: ranges where
    they are asked for, one exact version of each in its own constraints file."""
    pinned = pins(CUDA13_CLIENTS / "constraints.txt")
    name = canonicalize_name(requirement.name)
    assert {s.operator for s in requirement.specifier} == {">=", "<"}, requirement
    assert name in pinned, f"{requirement} has no pin in {CUDA13_CLIENTS / 'constraints.txt'}"
    assert requirement.specifier.contains(pinned[name], prereleases=True), f"{name}=={pinned[name]}"


def test_the_cuda13_client_line_is_cuda_13_and_the_development_line_cuda_12() -> None:
    """The two client lines the real-client tier runs differ in the driver API generation only:
    cuda-bindings 12 in .venv, 13 in .venv-cuda13, with the same cuda-core and numba-cuda."""
    cuda13 = pins(CUDA13_CLIENTS / "constraints.txt")
    cuda12 = pins()
    bindings = canonicalize_name("cuda-bindings")
    assert (cuda12[bindings].major, cuda13[bindings].major) == (12, 13)
    for name in ("cuda-core", "numba-cuda"):
        assert cuda12[canonicalize_name(name)] == cuda13[canonicalize_name(name)], name
