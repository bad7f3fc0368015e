"""The product's wheel carries the product only: built from what a clean checkout holds (all of it,
the development tree included, so that the packaging configuration and not .dockerignore decides),
by the call the local images make (testbed/product_images.py: pip wheel, no isolation), its RECORD
lists tessera/ and its dist-info and nothing of the test bed, the simulated driver, the demo, the
tools or the tests, and its commands are the product's five (four daemons and the kubectl plugin);
tessera-cluster is the development distribution's alone.

Cost: one wheel build per session, about 8 s on a shared 2-core machine (copying the checkout, compiling
the cffi binding and the preload libraries, generating the gRPC stubs): cheap enough for the unit tier.
"""

from __future__ import annotations

import configparser
import csv
import io
import tomllib
import zipfile
from email.parser import Parser
from pathlib import Path, PurePosixPath

import pytest
from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet
from packaging.utils import canonicalize_name

from testbed.product_images import build_wheel, checkout_files, copy_files
from tests.unit.layout.layout_facts import DEVELOPMENT, REPO, scripts

# Modules of the test bed that once sat beside the product's code: never under any name in the wheel.
DEVELOPMENT_MODULES = {"testbed", "simgpu", "shim_harness", "crashing_driver"}


class Wheel:
    """A built wheel's RECORD, entry points, metadata and file names."""

    def __init__(self, path: Path) -> None:
        with zipfile.ZipFile(path) as archive:
            self.names = set(archive.namelist())
            [self.dist_info] = {PurePosixPath(n).parts[0] for n in self.names if ".dist-info/" in n}
            self.record = [row[0] for row in csv.reader(io.StringIO(self.read(archive, "RECORD")))]
            self.entry_points = configparser.ConfigParser()
            self.entry_points.read_string(self.read(archive, "entry_points.txt"))
            self.metadata = Parser().parsestr(self.read(archive, "METADATA"))

    def read(self, archive: zipfile.ZipFile, name: str) -> str:
        return archive.read(f"{self.dist_info}/{name}").decode()


@pytest.fixture(scope="session")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Wheel:
    work = tmp_path_factory.mktemp("wheel")
    copy_files(REPO, checkout_files(REPO), work / "checkout")
    return Wheel(build_wheel(work / "checkout", work / "wheels"))


def test_the_record_lists_every_file_of_the_wheel(wheel: Wheel) -> None:
    assert set(wheel.record) == wheel.names
    assert len(wheel.record) == len(wheel.names)


def test_every_file_is_the_products_package_or_its_metadata(wheel: Wheel) -> None:
    assert wheel.dist_info.startswith("tessera-")
    outside = [
        name for name in wheel.record if PurePosixPath(name).parts[0] not in {"tessera", wheel.dist_info}
    ]
    assert outside == []


def test_nothing_of_the_development_tree_is_in_the_wheel(wheel: Wheel) -> None:
    """Neither its folders at the top (testbed/, simgpu/, demo/, tools/, tests/, benchmarks/) nor a
    module of the test bed anywhere inside the package."""
    paths = [PurePosixPath(name) for name in wheel.record]
    assert [p for p in paths if p.parts[0] in DEVELOPMENT] == []
    assert [p for p in paths if {part.split(".")[0] for part in p.parts} & DEVELOPMENT_MODULES] == []
    assert "tessera/driver/daemon.py" in wheel.record, "the check above looked at the product's files"


def test_the_web_views_template_and_style_sheet_are_in_the_wheel(wheel: Wheel) -> None:
    assert {"tessera/webview/templates/index.html", "tessera/webview/static/webview.css"} <= set(wheel.record)


def test_the_commands_are_the_products_six_and_no_test_bed_command(wheel: Wheel) -> None:
    assert wheel.entry_points.sections() == ["console_scripts"]
    commands = dict(wheel.entry_points["console_scripts"])
    assert commands == scripts(REPO / "pyproject.toml")
    assert len(commands) == 6
    assert "tessera-cluster" not in commands
    assert "tessera-cluster" in scripts(REPO / "dev" / "pyproject.toml")


def requirements(lines: list[str]) -> set[tuple[str, SpecifierSet]]:
    return {(canonicalize_name(r.name), r.specifier) for r in map(Requirement, lines)}


def test_the_metadata_declares_the_ranges_and_no_extra(wheel: Wheel) -> None:
    """What a user's resolver reads: pyproject.toml's ranges (not constraints.txt's pins), and no
    development extra pulling in the checkers."""
    declared = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["dependencies"]
    assert requirements(wheel.metadata.get_all("Requires-Dist") or []) == requirements(declared)
    assert wheel.metadata.get_all("Provides-Extra") is None
