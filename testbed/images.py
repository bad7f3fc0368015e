"""Container images made from files on this machine, so that a real node never pulls from a registry.

An image here is one uncompressed layer holding chosen host files (programs, and the shared libraries
`ldd` says they load, at the same paths) written as an OCI image-layout archive, which
`ctr images import` loads into a node's containerd. Two images every node gets:

- the pod sandbox image (``PAUSE_IMAGE``): a static C program (images/pause.c), compiled here;
- a tools image (``TOOLS_IMAGE``): this machine's shell and a few coreutils with their glibc, enough
  for test pods to print what they see (environment, mounts, files).

Tests add their own images (workload programs, the simulated driver libraries) with ``ImageSpec``.
Layers are written deterministically (sorted, zero mtimes, root owner) so one set of files always gives
one digest. Run by hand: ``python -m tessera.testbed.images build OUT_DIR``, or ``import`` to load
archives into a running containerd.
"""

from __future__ import annotations

import argparse
import hashlib
import io
import json
import platform
import re
import shutil
import subprocess
import sys
import tarfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

PAUSE_IMAGE = "tessera.local/pause:v1"
TOOLS_IMAGE = "tessera.local/tools:v1"
# Enough for a test pod to run a script and show what it sees; taken from this machine, with glibc.
TOOLS_PROGRAMS = ("sh", "cat", "env", "sleep", "ls", "grep", "test", "true")
PAUSE_SOURCE = Path(__file__).with_name("images") / "pause.c"

_MANIFEST = "application/vnd.oci.image.manifest.v1+json"
_CONFIG = "application/vnd.oci.image.config.v1+json"
_LAYER = "application/vnd.oci.image.layer.v1.tar"
_INDEX = "application/vnd.oci.image.index.v1+json"
# Directories runc mounts over or the kubelet writes into; an image without them still runs (runc
# creates mount points), but having them keeps the container's root read-only-friendly.
_SKELETON_DIRECTORIES = ("dev", "etc", "proc", "sys", "tmp", "var", "run")
_LDD_LIBRARY = re.compile(r"(?:=>\s*)?(/\S+)\s+\(0x[0-9a-f]+\)")


@dataclass(frozen=True)
class ImageSpec:
    """What goes into one image: files by their path in the image, and how the image starts."""

    reference: str
    files: Mapping[str, Path]
    entrypoint: tuple[str, ...] = ()
    command: tuple[str, ...] = ()
    env: tuple[str, ...] = ("PATH=/bin:/usr/bin",)
    # Copy each ELF file's shared libraries (per `ldd`) to the paths the dynamic loader expects.
    include_shared_libraries: bool = True


def shared_libraries(program: Path) -> list[Path]:
    """The shared objects (dynamic loader included) that `program` loads, as absolute host paths;
    empty for a static program or a file that is not a dynamic executable."""
    result = subprocess.run(["ldd", str(program)], capture_output=True, text=True, check=False)
    if result.returncode != 0:
        return []
    return [Path(m.group(1)) for m in map(_LDD_LIBRARY.search, result.stdout.splitlines()) if m]


def _with_shared_libraries(files: Mapping[str, Path]) -> dict[str, Path]:
    """files plus every shared library they need, each placed at its host path (so the loader's
    built-in search directories find it without an ld.so.cache)."""
    closed = dict(files)
    for source in files.values():
        for library in shared_libraries(source):
            closed.setdefault(str(library), library)
    return closed


def _tar_info(name: str, *, mode: int, size: int = 0, directory: bool = False) -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.type = tarfile.DIRTYPE if directory else tarfile.REGTYPE
    info.mode = mode
    info.size = size
    info.mtime = 0
    info.uid = info.gid = 0
    info.uname = info.gname = "root"
    return info


def layer_bytes(files: Mapping[str, Path]) -> bytes:
    """A deterministic uncompressed tar of `files` (image path -> host file, symlinks followed),
    with every parent directory and the skeleton directories present."""
    entries = {str(PurePosixPath(p)).lstrip("/"): source for p, source in files.items()}
    directories = set(_SKELETON_DIRECTORIES)
    for name in entries:
        directories.update(str(parent) for parent in PurePosixPath(name).parents if str(parent) != ".")
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for directory in sorted(directories):
            mode = 0o1777 if directory == "tmp" else 0o755
            tar.addfile(_tar_info(directory, mode=mode, directory=True))
        for name, source in sorted(entries.items()):
            data = source.read_bytes()
            info = _tar_info(name, mode=source.stat().st_mode & 0o7777, size=len(data))
            tar.addfile(info, io.BytesIO(data))
    return buffer.getvalue()


def _oci_architecture() -> str:
    machine = platform.machine()
    return {"x86_64": "amd64", "aarch64": "arm64"}.get(machine, machine)


def _blob(blobs: dict[str, bytes], data: bytes, media_type: str) -> dict[str, object]:
    digest = "sha256:" + hashlib.sha256(data).hexdigest()
    blobs[digest] = data
    return {"mediaType": media_type, "digest": digest, "size": len(data)}


def _json(value: object) -> bytes:
    return json.dumps(value, sort_keys=True, separators=(",", ":")).encode()


def build_image(spec: ImageSpec, out_dir: Path) -> Path:
    """Write `spec` as an OCI image-layout archive in out_dir and return its path."""
    files = _with_shared_libraries(spec.files) if spec.include_shared_libraries else dict(spec.files)
    layer = layer_bytes(files)
    blobs: dict[str, bytes] = {}
    layer_descriptor = _blob(blobs, layer, _LAYER)
    arch = _oci_architecture()
    config: dict[str, object] = {
        "architecture": arch,
        "os": "linux",
        "config": {
            "Env": list(spec.env),
            "Entrypoint": list(spec.entrypoint) or None,
            "Cmd": list(spec.command) or None,
            "WorkingDir": "/",
        },
        # Uncompressed layer: its diff ID is its digest.
        "rootfs": {"type": "layers", "diff_ids": [layer_descriptor["digest"]]},
    }
    manifest = {
        "schemaVersion": 2,
        "mediaType": _MANIFEST,
        "config": _blob(blobs, _json(config), _CONFIG),
        "layers": [layer_descriptor],
    }
    manifest_descriptor = _blob(blobs, _json(manifest), _MANIFEST)
    tag = spec.reference.rpartition(":")[2]
    manifest_descriptor["platform"] = {"architecture": arch, "os": "linux"}
    # containerd names the imported image after io.containerd.image.name; the OCI ref name is the tag.
    manifest_descriptor["annotations"] = {
        "io.containerd.image.name": spec.reference,
        "org.opencontainers.image.ref.name": tag,
    }
    index = {"schemaVersion": 2, "mediaType": _INDEX, "manifests": [manifest_descriptor]}

    out_dir.mkdir(parents=True, exist_ok=True)
    archive = out_dir / (re.sub(r"[^A-Za-z0-9_.-]", "_", spec.reference) + ".tar")
    with tarfile.open(archive, "w", format=tarfile.PAX_FORMAT) as tar:
        layout = {"oci-layout": _json({"imageLayoutVersion": "1.0.0"}), "index.json": _json(index)}
        layout.update({f"blobs/sha256/{d.removeprefix('sha256:')}": data for d, data in blobs.items()})
        tar.addfile(_tar_info("blobs", mode=0o755, directory=True))
        tar.addfile(_tar_info("blobs/sha256", mode=0o755, directory=True))
        for name, data in layout.items():
            tar.addfile(_tar_info(name, mode=0o644, size=len(data)), io.BytesIO(data))
    return archive


def compile_pause(out_dir: Path) -> Path:
    """Compile images/pause.c statically (no libraries needed in its image)."""
    compiler = shutil.which("cc") or shutil.which("gcc")
    if compiler is None:
        raise FileNotFoundError("a C compiler (cc or gcc) is needed to build the pod sandbox image")
    out_dir.mkdir(parents=True, exist_ok=True)
    program = out_dir / "pause"
    subprocess.run([compiler, "-static", "-O2", "-o", str(program), str(PAUSE_SOURCE)], check=True)
    return program


def host_program(name: str) -> Path:
    """The real file behind a program on PATH (so /bin/sh -> dash is copied as the program itself)."""
    found = shutil.which(name)
    if found is None:
        raise FileNotFoundError(f"{name!r} is not on PATH; the tools image needs it")
    return Path(found).resolve()


def standard_images(out_dir: Path) -> list[Path]:
    """Build the two images every node gets (pod sandbox and tools) into out_dir; return the archives."""
    pause = ImageSpec(
        PAUSE_IMAGE,
        {"/pause": compile_pause(out_dir / "build")},
        entrypoint=("/pause",),
        include_shared_libraries=False,
    )
    tools = ImageSpec(
        TOOLS_IMAGE,
        {f"/bin/{name}": host_program(name) for name in TOOLS_PROGRAMS},
        command=("/bin/sh",),
    )
    return [build_image(pause, out_dir), build_image(tools, out_dir)]


def import_image(ctr: Path, containerd_socket: Path, archive: Path) -> None:
    """Load an archive into a containerd's `k8s.io` namespace (the one its CRI plugin serves) and
    unpack it for the default snapshotter, so the kubelet finds it present and never pulls."""
    subprocess.run(
        [
            str(ctr),
            "--address",
            str(containerd_socket),
            "--namespace",
            "k8s.io",
            "images",
            "import",
            "--platform",
            f"linux/{_oci_architecture()}",
            str(archive),
        ],
        check=True,
        capture_output=True,
        text=True,
    )


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m tessera.testbed.images",
        description="Build container images from local files and import them into a containerd.",
    )
    sub = parser.add_subparsers(dest="command", required=True)
    build = sub.add_parser("build", help=f"build {PAUSE_IMAGE} and {TOOLS_IMAGE} as OCI archives")
    build.add_argument("out_dir", type=Path)
    load = sub.add_parser("import", help="import OCI archives into a containerd's k8s.io namespace")
    load.add_argument("--ctr", type=Path, required=True, help="the ctr binary")
    load.add_argument("--address", type=Path, required=True, help="containerd's socket")
    load.add_argument("archives", type=Path, nargs="+")
    args = parser.parse_args(argv)
    if args.command == "build":
        for archive in standard_images(args.out_dir):
            print(archive)
    else:
        for archive in args.archives:
            import_image(args.ctr, args.address, archive)
    return 0


if __name__ == "__main__":
    sys.exit(main())
