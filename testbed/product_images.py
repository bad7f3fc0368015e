"""Tessera's own images (node daemon, webhook) as OCI archives for the test bed's nodes, assembled
from this machine's files the way images/Dockerfile builds them: no container engine, no registry.

images/images.toml is the one list of what goes in; this module lays it out in a root folder:

1. the wheel: the project's own build (setup.py: the cffi binding, the preload shim, the gRPC
   stubs) run by pip on a copy of what the Dockerfile's build context holds (git's tracked and
   unignored files), with the build requirements of this environment (constraints.txt's versions);
2. Debian's Python: the files the manifest's packages installed here (``dpkg -L``), the Dockerfile
   installs the same packages into its base image;
3. the virtual environment (``--copies``) whose pip installs the wheel with its dependencies at
   the versions constraints.txt pins, and its commands: the Dockerfile's commands
   (``venv_commands``), made in the root folder and then given the image's path in its scripts and
   pyvenv.cfg;
4. the shared libraries the ELF files there load (``ldd``), at their host paths, standing in for
   the base image's.

Both images share that one layer and differ only in their configuration (user, entrypoint). They are
built once per set of inputs into the cache (``product_images``); ``python -m
testbed.product_images`` prints their archives.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import sys
import tomllib
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

from testbed.binaries import cache_root
from testbed.commands import run_checked
from testbed.images import ImageSpec, archive_name, build_image, cached_build, shared_libraries

REPO = Path(__file__).resolve().parent.parent
MANIFEST = REPO / "images" / "images.toml"
DOCKERFILE = REPO / "images" / "Dockerfile"
# The exact versions the images install (a file of the build context, so of the cache digest too).
CONSTRAINTS = REPO / "constraints.txt"
# Local images are named under a registry host that never resolves, so a node never tries to pull.
LOCAL_REGISTRY = "tessera.local"
_ELF = b"\x7fELF"
_BUILD_TIMEOUT = 1200


@dataclass(frozen=True)
class ProductImage:
    """One image of the manifest: its Dockerfile target (the table's name) and its configuration."""

    target: str
    repository: str
    user: str
    entrypoint: tuple[str, ...]


@dataclass(frozen=True)
class Manifest:
    """images/images.toml, read."""

    base: str
    apt_packages: tuple[str, ...]
    python: str
    build_env: tuple[str, ...]
    venv: str
    workdir: str
    env: tuple[str, ...]
    images: Mapping[str, ProductImage]


def load_manifest(path: Path = MANIFEST) -> Manifest:
    data = tomllib.loads(path.read_text())
    runtime = data["runtime"]
    return Manifest(
        base=runtime["base"],
        apt_packages=tuple(runtime["apt_packages"]),
        python=runtime["python"],
        build_env=tuple(runtime["build_env"]),
        venv=runtime["venv"],
        workdir=runtime["workdir"],
        env=tuple(runtime["env"]),
        images={
            name: ProductImage(name, image["repository"], image["user"], tuple(image["entrypoint"]))
            for name, image in data["images"].items()
        },
    )


def project_version() -> str:
    """The package version (pyproject.toml), which tags the local images."""
    return str(tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["version"])


def reference(image: ProductImage, tag: str | None = None) -> str:
    return f"{LOCAL_REGISTRY}/{image.repository}:{tag or project_version()}"


def image_spec(
    manifest: Manifest, image: ProductImage, files: Mapping[str, Path], version: str | None = None
) -> ImageSpec:
    """The test bed's image for one manifest entry, made of ``files`` (image path -> host file),
    tagged ``version`` (by default the checkout's)."""
    return ImageSpec(
        reference(image, version),
        files,
        entrypoint=image.entrypoint,
        env=manifest.env,
        user=image.user,
        include_shared_libraries=False,  # done once for the whole root (elf_libraries), not per file
    )


# -- the root folder --------------------------------------------------------------------------


def ignored_folders(repo: Path = REPO) -> set[str]:
    """The top-level names .dockerignore leaves out of the build context (its lines without a
    slash or a wildcard; the others name what git ignores too)."""
    lines = (line.strip() for line in (repo / ".dockerignore").read_text().splitlines())
    return {line for line in lines if line and not line.startswith("#") and not set(line) & set("/*?![")}


def checkout_files(repo: Path = REPO) -> list[str]:
    """What a clean checkout holds: every file git tracks or would track (not ignored), as
    repository paths, and none of the local builds."""
    listed = run_checked(
        ["git", "-C", repo, "ls-files", "-z", "--cached", "--others", "--exclude-standard"], timeout=60
    )
    names = sorted({name for name in listed.split("\0") if name})
    return [name for name in names if (repo / name).is_symlink() or (repo / name).is_file()]


def context_files(repo: Path = REPO) -> list[str]:
    """The build context: the checkout's files outside the folders .dockerignore leaves out."""
    left_out = ignored_folders(repo)
    return [name for name in checkout_files(repo) if name.split("/", 1)[0] not in left_out]


def copy_files(repo: Path, names: Iterable[str], dest: Path) -> None:
    """Copy the repository paths ``names`` under ``dest``, a link as a link."""
    for name in names:
        source, target = repo / name, dest / name
        target.parent.mkdir(parents=True, exist_ok=True)
        if source.is_symlink():
            target.symlink_to(os.readlink(source))
        else:
            shutil.copy2(source, target)


def build_wheel(source: Path, out_dir: Path) -> Path:
    """The project's wheel, made by its own build (setup.py) through pip."""
    run_checked(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--no-deps",
            "--no-build-isolation",
            "--wheel-dir",
            out_dir,
            source,
        ],
        timeout=_BUILD_TIMEOUT,
    )
    [wheel] = out_dir.glob("tessera-*.whl")
    return wheel


def package_files(packages: tuple[str, ...]) -> dict[str, Path]:
    """The regular files (links followed) the Debian packages installed on this machine."""
    listed = run_checked(["dpkg", "-L", *packages], timeout=60)
    files: dict[str, Path] = {}
    for line in listed.splitlines():
        path = Path(line.strip())
        if path.is_absolute() and path.is_file() and not path.is_dir():
            files[str(path)] = path
    return files


def venv_commands(manifest: Manifest, venv: str, wheel: str, constraints: str) -> list[list[str]]:
    """The commands that make the virtual environment at ``venv`` and fill it with the wheel and
    its dependencies at the versions of ``constraints`` (the repository's constraints.txt): the
    Dockerfile's build stage runs them at the manifest's path, the local build under its root folder."""
    return [
        [manifest.python, "-m", "venv", "--copies", venv],
        [f"{venv}/bin/pip", "install", "--no-compile", "--constraint", constraints, wheel],
        [f"{venv}/bin/pip", "uninstall", "--yes", "pip", "setuptools"],
    ]


def make_venv(manifest: Manifest, root: Path, wheel: Path, constraints: Path) -> None:
    """The manifest's virtual environment under ``root``, with the wheel and its dependencies, made
    by the Dockerfile's commands in its build stage's environment; then moved to the image's path,
    as a venv is not relocatable: the folder it was made in, which its scripts' first lines and
    pyvenv.cfg name, becomes the image's."""
    venv = root / manifest.venv.lstrip("/")
    env = dict(os.environ) | dict(item.split("=", 1) for item in manifest.build_env)
    for command in venv_commands(manifest, str(venv), str(wheel), str(constraints)):
        run_checked(command, timeout=_BUILD_TIMEOUT, env=env)
    for path in [venv / "pyvenv.cfg", *(venv / "bin").iterdir()]:
        data = path.read_bytes()
        if not data.startswith(_ELF) and str(venv).encode() in data:
            path.write_bytes(data.replace(str(venv).encode(), manifest.venv.encode()))


def _walk(root: Path) -> Iterator[Path]:
    for folder, _, names in os.walk(root):
        for name in names:
            yield Path(folder) / name


def elf_libraries(files: Mapping[str, Path], root: Path) -> dict[str, Path]:
    """Shared libraries the ELF files among ``files`` load from outside ``root`` (the folder the
    build made; what is inside it is in the image already), at their host paths."""
    found: dict[str, Path] = {}
    for path in files.values():
        with path.open("rb") as file:
            if file.read(4) != _ELF:
                continue
        for library in shared_libraries(path):
            if not library.is_relative_to(root):
                found.setdefault(str(library), library)
    return found


def root_files(manifest: Manifest, work: Path, version: str) -> dict[str, Path]:
    """Build the root folder in ``work`` and return every file of the image (image path -> file);
    the package is built as ``version`` (the checkout's own, or another build of the same tree)."""
    context, wheels, root = work / "context", work / "wheels", work / "root"
    copy_files(REPO, context_files(REPO), context)
    set_version(context / "pyproject.toml", version)
    wheel = build_wheel(context, wheels)
    make_venv(manifest, root, wheel, context / CONSTRAINTS.name)
    files = package_files(manifest.apt_packages)
    files.update({f"/{p.relative_to(root)}": p for p in _walk(root) if p.is_file()})
    for image_path, library in elf_libraries(files, root).items():
        files.setdefault(image_path, library)
    return files


def set_version(pyproject: Path, version: str) -> None:
    """Make the project in ``pyproject`` (a copy of the checkout's) build as ``version``."""
    text = pyproject.read_text()
    current = f'version = "{project_version()}"\n'
    assert current in text, f"no {current.strip()} in {pyproject}"
    pyproject.write_text(text.replace(current, f'version = "{version}"\n', 1))


def build_product_images(
    out_dir: Path, manifest: Manifest | None = None, version: str | None = None
) -> dict[str, Path]:
    """Build every image of the manifest into out_dir, the package and the tags at ``version`` (by
    default the checkout's); return each target's archive."""
    manifest = manifest or load_manifest()
    version = version or project_version()
    work = out_dir / "build"
    files = root_files(manifest, work, version)
    archives = {
        name: build_image(image_spec(manifest, image, files, version), out_dir)
        for name, image in manifest.images.items()
    }
    shutil.rmtree(work)
    return archives


def context_digest(repo: Path = REPO) -> str:
    """A digest of the build context: every file's path and contents (a link's target)."""
    digest = hashlib.sha256()
    for name in context_files(repo):
        path = repo / name
        data = os.readlink(path).encode() if path.is_symlink() else path.read_bytes()
        digest.update(name.encode() + b"\0" + hashlib.sha256(data).digest())
    return digest.hexdigest()


def product_images_digest(version: str) -> str:
    """A digest of what the images are made of: the manifest, this builder and the image writer, the
    build context's files, the version they are built as, the Debian packages' versions and the
    Python that runs the build."""
    digest = hashlib.sha256()

    def add(label: str, data: bytes) -> None:
        digest.update(label.encode() + b"\0" + hashlib.sha256(data).digest())

    add("builder", Path(__file__).read_bytes())
    add("images.py", (Path(__file__).parent / "images.py").read_bytes())
    manifest = load_manifest()
    add("manifest", MANIFEST.read_bytes())
    add("context", context_digest().encode())
    versions = run_checked(["dpkg-query", "-W", *manifest.apt_packages], timeout=60)
    add("packages", versions.encode())
    add("python", sys.version.encode())
    add("version", version.encode())
    return digest.hexdigest()


def product_images(cache: Path | None = None, version: str | None = None) -> dict[str, Path]:
    """Each manifest image's archive, built once into <cache>/product-images/<digest>/, the package
    and the tags at ``version``: by default the checkout's; another gives a second build of the same
    tree (the upgrade test installs one and upgrades to the other)."""
    manifest = load_manifest()
    version = version or project_version()
    folder = cached_build(
        (cache or cache_root()) / "product-images",
        product_images_digest(version),
        lambda out: build_product_images(out, manifest, version),
    )
    return {name: folder / archive_name(reference(image, version)) for name, image in manifest.images.items()}


def main() -> int:
    for name, archive in product_images().items():
        print(f"{name}\t{archive}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
