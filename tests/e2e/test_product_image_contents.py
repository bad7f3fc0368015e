"""Both product images carry the product only: no path in any of their layers belongs to the test bed,
the simulated driver (its Python side or its libraries), the demo, the tools or the tests, and neither
has a tessera-cluster command, which only the development install (dev/pyproject.toml) provides. Every
distribution installed in them is at the version constraints.txt pins, as in the tests' environment.

The images are the ones the end-to-end tests run on nodes (testbed/product_images.py), read from the
cache those tests fill: in one run they are built once, by whichever test asks first (about 30 s on a
shared 2-core machine when the inputs changed, with pip's cache warm; nothing otherwise). Reading the
two archives takes under a second. No node is needed, but the tier is the one where these images are
built (it needs dpkg and pip's index, not root).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

import pytest
from packaging.utils import canonicalize_name
from packaging.version import Version

from testbed.product_images import Manifest, load_manifest, product_images, project_version
from tests.image_archive import read_archive
from tests.unit.layout.layout_facts import DEVELOPMENT
from tests.unit.packaging.constraints_file import pins

pytestmark = pytest.mark.e2e

# Names of the development tree's modules and distribution, wherever a path would hold them.
DEVELOPMENT_NAMES = {"testbed", "simgpu", "shim_harness", "crashing_driver", "tessera_dev"}
# The simulated driver's libraries (simgpu/Makefile) carry the real driver's names; an image carries
# neither: the host's driver libraries are mounted into the containers that need them.
DRIVER_LIBRARIES = ("libcuda.so", "libnvidia-ml.so")


@dataclass(frozen=True)
class ImageContents:
    paths: list[PurePosixPath]
    entry_points: str


def read_layers(archive: Path, entry_points: str) -> ImageContents:
    """Every path in every layer of an OCI archive, and the text of the file ``entry_points``."""
    image = read_archive(archive, [entry_points])
    return ImageContents(image.paths, image.texts.get(entry_points, ""))


def stem(part: str) -> str:
    """A path part's name before any dot or dash: a module's, a package's, a distribution's."""
    return re.split(r"[.-]", part, maxsplit=1)[0]


def site_packages(manifest: Manifest) -> PurePosixPath:
    return PurePosixPath(manifest.venv.lstrip("/"), "lib", "python3.11", "site-packages")


@pytest.fixture(scope="module")
def manifest() -> Manifest:
    return load_manifest()


@pytest.fixture(scope="module")
def images(manifest: Manifest) -> dict[str, ImageContents]:
    entry_points = site_packages(manifest) / f"tessera-{project_version()}.dist-info" / "entry_points.txt"
    archives = product_images()
    assert set(archives) == set(manifest.images)
    return {name: read_layers(archive, str(entry_points)) for name, archive in archives.items()}


def test_no_path_of_either_image_belongs_to_the_development_tree(
    manifest: Manifest, images: dict[str, ImageContents]
) -> None:
    """Not at the image's root, not as a top-level package of the environment, not inside Tessera's
    package, and no module of the test bed or the development distribution under any folder."""
    site = site_packages(manifest)
    for name, contents in images.items():
        installed = [p.relative_to(site) for p in contents.paths if p.is_relative_to(site) and p != site]
        assert installed, f"{name}: no site-packages at {site}"
        assert [p for p in contents.paths if p.parts[0] in DEVELOPMENT] == [], name
        assert [p for p in installed if stem(p.parts[0]) in DEVELOPMENT] == [], name
        product = [p for p in installed if p.parts[0] == "tessera"]
        assert [p for p in product if set(p.parts) & set(DEVELOPMENT)] == [], name
        assert [p for p in contents.paths if {stem(part) for part in p.parts} & DEVELOPMENT_NAMES] == [], name
        assert PurePosixPath("tessera/driver/daemon.py") in product, f"{name}: the checks saw the product"


def test_every_distribution_in_either_image_is_at_its_pin(
    manifest: Manifest, images: dict[str, ImageContents]
) -> None:
    """The images install with --constraint constraints.txt (Dockerfile and local build alike)."""
    site = site_packages(manifest)
    pinned = pins()
    for name, contents in images.items():
        installed = {
            canonicalize_name(distribution): Version(version)
            for p in contents.paths
            if p.parent == site and p.name.endswith(".dist-info")
            for distribution, version in [p.name.removesuffix(".dist-info").rsplit("-", 1)]
        }
        assert installed.pop(canonicalize_name("tessera")) == Version(project_version()), name
        assert {"kubernetes", "grpcio", "protobuf", "urllib3"} <= set(installed), name
        assert {d: v for d, v in installed.items() if pinned.get(d) != v} == {}, name


def test_neither_image_has_the_simulated_drivers_libraries(images: dict[str, ImageContents]) -> None:
    for name, contents in images.items():
        assert [p for p in contents.paths if p.name.startswith(DRIVER_LIBRARIES)] == [], name


def test_neither_image_has_a_tessera_cluster_command(
    manifest: Manifest, images: dict[str, ImageContents]
) -> None:
    """No such program anywhere, and Tessera's installed entry points name the product's commands
    only; the image's own entrypoint is one of them."""
    for name, contents in images.items():
        assert [p for p in contents.paths if p.name == "tessera-cluster"] == [], name
        assert "tessera-cluster" not in contents.entry_points, name
        assert "tessera-driver = tessera.driver.cli:main" in contents.entry_points, name
        entrypoint = PurePosixPath(manifest.images[name].entrypoint[0].lstrip("/"))
        assert entrypoint in contents.paths, name
