"""The images users build from images/Dockerfile are the images the test bed runs: built here by
buildah (testbed/dockerfile_images.py, on a Debian 12 base made from Debian's packages), each one
runs the programs the chart runs from it as this checkout's programs, finds the shim where the node
daemon looks for it, and holds the same configuration, the same files in the virtual environment
and the same distributions, at constraints.txt's versions, as the test bed's image of the same
target (testbed/product_images.py), whose contents tests/e2e/test_product_image_contents.py checks.

Cost (2-core machine, 2026-12-03; images/README.md has the table): cold, 2 min on a quiet machine,
under load about 2 min for the base and 6 for the build (apt, pip, PyPI); after a change to the
build context, about 1 min 40 s (the apt steps cached); with the inputs unchanged nothing is built
and the tier takes about 20 s, the time of its checks.
"""

from __future__ import annotations

import importlib
import os
import shutil
import tomllib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

import pytest
from packaging.utils import NormalizedName, canonicalize_name
from packaging.version import Version

from testbed import dockerfile_images
from testbed.buildah import Buildah
from testbed.product_images import REPO, Manifest, load_manifest, product_images, project_version
from tests.image_archive import ArchiveImage, read_archive
from tests.unit.packaging.constraints_file import pins

# A cold build's first test sets up the images (minutes: docs above).
pytestmark = [pytest.mark.dockerfile, pytest.mark.timeout(2400)]

# What the chart runs from each image, by name on PATH: its entrypoint, and the exporter
# (exporter-daemonset.yaml, the driver's image), the admission check (admissioncheck-deployment.yaml) and
# the web view (webview-deployment.yaml).
CHART_PROGRAMS = {
    "driver": ("tessera-driver", "tessera-exporter"),
    "webhook": ("tessera-webhook", "tessera-admission-check", "tessera-webview"),
}
# A fixed width, so that the help text does not depend on a terminal.
COLUMNS = "100"


@dataclass(frozen=True)
class BuiltImage:
    reference: str
    container: str
    root: Path


@pytest.fixture(scope="module")
def manifest() -> Manifest:
    return load_manifest()


@pytest.fixture(scope="module")
def buildah() -> Buildah:
    if os.geteuid() != 0:
        pytest.skip("building images/Dockerfile needs root: mmdebstrap, and buildah's overlay store")
    missing = [tool for tool in ("buildah", "mmdebstrap") if shutil.which(tool) is None]
    if missing:
        pytest.fail(f"{', '.join(missing)} not installed: run `make host-packages`")
    return dockerfile_images.store()


@pytest.fixture(scope="module")
def built(buildah: Buildah) -> Iterator[dict[str, BuiltImage]]:
    """Each target's image, with a check container mounted on the host while the module runs."""
    images: dict[str, BuiltImage] = {}
    for target, reference in dockerfile_images.dockerfile_images().items():
        container = dockerfile_images.check_container(buildah, reference)
        images[target] = BuiltImage(reference, container, buildah.mount(container))
    yield images
    for image in images.values():
        buildah("rm", image.container)


@pytest.fixture(scope="module")
def test_bed(manifest: Manifest) -> dict[str, ArchiveImage]:
    return {target: read_archive(archive) for target, archive in product_images().items()}


def site_packages(manifest: Manifest) -> PurePosixPath:
    return PurePosixPath(manifest.venv.lstrip("/"), "lib", "python3.11", "site-packages")


def venv_files(root: Path, manifest: Manifest) -> set[PurePosixPath]:
    """The files (links to folders aside) under the virtual environment of a mounted image."""
    venv = root / manifest.venv.lstrip("/")
    found: set[PurePosixPath] = set()
    for folder, folders, names in os.walk(venv):
        for name in [*names, *folders]:
            path = Path(folder) / name
            if not path.is_dir():
                found.add(PurePosixPath(path.relative_to(root)))
    return found


def entry_point_modules() -> dict[str, str]:
    """Each program's module, from the checkout's pyproject.toml."""
    scripts = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["scripts"]
    return {program: target.partition(":")[0] for program, target in scripts.items()}


def checkout_help(program: str, env: list[str], monkeypatch: pytest.MonkeyPatch) -> str:
    """``program --help`` as this checkout's parser prints it in the environment ``env``."""
    for name in list(os.environ):
        monkeypatch.delenv(name)
    for item in env:
        monkeypatch.setenv(*item.split("=", 1))
    module = importlib.import_module(entry_point_modules()[program])
    return str(module.parser().format_help())


def distributions(files: set[PurePosixPath], manifest: Manifest) -> dict[NormalizedName, Version]:
    site = site_packages(manifest)
    folders = {p.parent for p in files if p.parent.parent == site and p.parent.name.endswith(".dist-info")}
    return {
        canonicalize_name(name): Version(version)
        for folder in folders
        for name, version in [folder.name.removesuffix(".dist-info").rsplit("-", 1)]
    }


def test_each_image_runs_the_programs_the_chart_runs_from_it_as_this_checkouts_programs(
    buildah: Buildah,
    built: dict[str, BuiltImage],
    manifest: Manifest,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """As the image's user, by name on the image's PATH, in the image's environment."""
    assert set(CHART_PROGRAMS) == set(manifest.images)
    for target, programs in CHART_PROGRAMS.items():
        image = built[target]
        env = [*buildah.config(image.reference)["Env"], f"COLUMNS={COLUMNS}"]
        for program in programs:
            printed = buildah.run(image.container, [program, "--help"], env=[f"COLUMNS={COLUMNS}"])
            with monkeypatch.context() as patch:
                assert printed == checkout_help(program, env, patch), f"{target}: {program}"


def test_each_image_finds_the_shim_where_the_test_beds_image_has_it(
    buildah: Buildah, built: dict[str, BuiltImage], test_bed: dict[str, ArchiveImage]
) -> None:
    """The node daemon copies the preload libraries from where the installed package says they
    are built; the image's own Python names them, and the compiled binding it loaded."""
    script = (
        "from tessera.shim import _format, install; "
        "print(install.built_library_dir() / install.CUDA_LIBRARY); "
        "print(install.built_library_dir() / install.NVML_LIBRARY); "
        "print(_format.__file__)"
    )
    for target, image in built.items():
        printed = buildah.run(image.container, ["python", "-c", script]).split()
        libraries = [PurePosixPath(p.lstrip("/")) for p in printed]
        assert len(libraries) == 3, printed
        for library in libraries:
            assert (image.root / library).is_file(), f"{target}: {library}"
            assert library in test_bed[target].files, f"{target}: the test bed's image lacks {library}"
        shim = libraries[0].parent.parent
        assert {p for p in venv_files(image.root, load_manifest()) if p.is_relative_to(shim)} == {
            p for p in test_bed[target].files if p.is_relative_to(shim)
        }, target


def test_each_image_has_the_configuration_of_the_test_beds_image_and_the_manifest(
    buildah: Buildah, built: dict[str, BuiltImage], test_bed: dict[str, ArchiveImage], manifest: Manifest
) -> None:
    for target, image in built.items():
        config = buildah.config(image.reference)
        expected = manifest.images[target]
        for key in ("Entrypoint", "User", "Env", "WorkingDir"):
            assert config.get(key) == test_bed[target].config.get(key), f"{target}: {key}"
        assert config["Entrypoint"] == list(expected.entrypoint)
        assert config["User"] == expected.user
        assert config["Env"] == list(manifest.env)


def test_each_images_virtual_environment_holds_the_files_of_the_test_beds(
    built: dict[str, BuiltImage], test_bed: dict[str, ArchiveImage], manifest: Manifest
) -> None:
    """Path for path: the package, the shim, the commands, every dependency; no bytecode."""
    venv = PurePosixPath(manifest.venv.lstrip("/"))
    for target, image in built.items():
        dockerfile = venv_files(image.root, manifest)
        local = {p for p in test_bed[target].files if p.is_relative_to(venv)}
        assert sorted(dockerfile - local) == [], target
        assert sorted(local - dockerfile) == [], target
        assert [p for p in dockerfile if p.suffix == ".pyc"] == [], target


def test_every_distribution_in_each_image_is_at_its_pin_as_in_the_test_beds_image(
    built: dict[str, BuiltImage], test_bed: dict[str, ArchiveImage], manifest: Manifest
) -> None:
    pinned = pins()
    for target, image in built.items():
        installed = distributions(venv_files(image.root, manifest), manifest)
        assert installed == distributions(set(test_bed[target].files), manifest), target
        assert installed.pop(canonicalize_name("tessera")) == Version(project_version()), target
        assert {"kubernetes", "grpcio", "protobuf", "cffi"} <= set(installed), target
        assert {d: v for d, v in installed.items() if pinned.get(d) != v} == {}, target


def test_neither_image_carries_the_build_stages_compiler_or_files(built: dict[str, BuiltImage]) -> None:
    for target, image in built.items():
        assert not (image.root / "usr/bin/gcc").exists(), target
        assert not (image.root / "src").exists(), target
        assert not (image.root / "build").exists(), target
        assert (image.root / "usr/bin/python3.11").is_file(), target
