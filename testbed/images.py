"""Container images made from files on this machine, so that a real node never pulls from a registry.

An image here is one uncompressed layer holding chosen host files (programs, and the shared libraries
`ldd` says they load, at the same paths) written as an OCI image-layout archive, which
`ctr images import` loads into a node's containerd. Two images every node gets:

- the pod sandbox image (``PAUSE_IMAGE``): a static C program (images/pause.c), compiled here;
- a tools image (``TOOLS_IMAGE``): this machine's shell and a few coreutils with their glibc, enough
  for test pods to print what they see (environment, mounts, files).

Tests add their own images (workload programs, the simulated driver libraries) with ``ImageSpec``.
Layers are written deterministically (sorted, zero mtimes, root owner) so one set of files always gives
one digest. The two standard images are built once per set of inputs into the binaries' cache
(``standard_images``) and reused by every later run.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import io
import json
import os
import platform
import re
import shutil
import subprocess
import tarfile
import tempfile
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from testbed.binaries import cache_root
from testbed.commands import run_checked

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
# Prefix of standard_images' temporary build folders: .building-<pid>-<random>.
_BUILDING = ".building-"
_LOCK = ".lock-"
"""Prefix of the lock file each digest is built under (one builder at a time per digest)."""
_LDD_LIBRARY = re.compile(r"(?:=>\s*)?(/\S+)\s+\(0x[0-9a-f]+\)")


@dataclass(frozen=True)
class ImageSpec:
    """What goes into one image: files by their path in the image, and how the image starts."""

    reference: str
    files: Mapping[str, Path]
    entrypoint: tuple[str, ...] = ()
    command: tuple[str, ...] = ()
    env: tuple[str, ...] = ("PATH=/bin:/usr/bin",)
    # The user the image runs as ("uid:gid"); empty: the runtime's default, root.
    user: str = ""
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


def archive_name(reference: str) -> str:
    """The file name build_image gives the archive of an image reference."""
    return re.sub(r"[^A-Za-z0-9_.-]", "_", reference) + ".tar"


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
            **({"User": spec.user} if spec.user else {}),
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
    archive = out_dir / archive_name(spec.reference)
    with tarfile.open(archive, "w", format=tarfile.PAX_FORMAT) as tar:
        layout = {"oci-layout": _json({"imageLayoutVersion": "1.0.0"}), "index.json": _json(index)}
        layout.update({f"blobs/sha256/{d.removeprefix('sha256:')}": data for d, data in blobs.items()})
        tar.addfile(_tar_info("blobs", mode=0o755, directory=True))
        tar.addfile(_tar_info("blobs/sha256", mode=0o755, directory=True))
        for name, data in layout.items():
            tar.addfile(_tar_info(name, mode=0o644, size=len(data)), io.BytesIO(data))
    return archive


def _compiler() -> str | None:
    return shutil.which("cc") or shutil.which("gcc")


def compile_pause(out_dir: Path) -> Path:
    """Compile images/pause.c statically (no libraries needed in its image)."""
    compiler = _compiler()
    if compiler is None:
        raise FileNotFoundError("a C compiler (cc or gcc) is needed to build the pod sandbox image")
    out_dir.mkdir(parents=True, exist_ok=True)
    program = out_dir / "pause"
    run_checked([compiler, "-static", "-O2", "-o", program, PAUSE_SOURCE], timeout=120)
    return program


def host_program(name: str) -> Path:
    """The real file behind a program on PATH (so /bin/sh -> dash is copied as the program itself)."""
    found = shutil.which(name)
    if found is None:
        raise FileNotFoundError(f"{name!r} is not on PATH; the tools image needs it")
    return Path(found).resolve()


def _tools_image() -> ImageSpec:
    return ImageSpec(
        TOOLS_IMAGE,
        {f"/bin/{name}": host_program(name) for name in TOOLS_PROGRAMS},
        command=("/bin/sh",),
    )


def build_standard_images(out_dir: Path) -> list[Path]:
    """Build the two images every node gets (pod sandbox, tools) into out_dir; return the archives."""
    build = out_dir / "build"
    pause = ImageSpec(
        PAUSE_IMAGE, {"/pause": compile_pause(build)}, entrypoint=("/pause",), include_shared_libraries=False
    )
    archives = [build_image(pause, out_dir), build_image(_tools_image(), out_dir)]
    shutil.rmtree(build)
    return archives


def standard_images_digest() -> str:
    """A digest of everything the standard images are made from: this builder, pause.c and the
    compiler that builds it, the architecture, and the tools image's host files (shared libraries
    included). Equal digests give equal images, so the digest names their cache folder."""
    digest = hashlib.sha256()

    def add(label: str, data: bytes) -> None:
        digest.update(label.encode() + b"\0" + hashlib.sha256(data).digest())

    add("builder", Path(__file__).read_bytes())
    add("pause.c", PAUSE_SOURCE.read_bytes())
    compiler = _compiler()
    version = run_checked([compiler, "--version"], timeout=60) if compiler else ""
    add("compiler", f"{compiler}\n{version}".encode())
    add("architecture", _oci_architecture().encode())
    for image_path, source in sorted(_with_shared_libraries(_tools_image().files).items()):
        add(image_path, source.read_bytes())
    return digest.hexdigest()


def standard_images(cache: Path | None = None) -> list[Path]:
    """The archives of the two images every node gets (pod sandbox, tools), built once into
    <cache>/images/<digest of their inputs>/ and reused while the inputs stay the same."""
    final = cached_build((cache or cache_root()) / "images", standard_images_digest(), build_standard_images)
    return [final / archive_name(PAUSE_IMAGE), final / archive_name(TOOLS_IMAGE)]


KEPT_BUILDS = 3
"""Builds kept under one cache folder, the most recently used. Product images are keyed by the
checkout's files, so every commit tested makes a new build of several hundred MB; three cover a
checkout, its predecessor and a fresh clone beside them."""


def cached_build(base: Path, digest: str, build: Callable[[Path], object], keep: int = KEPT_BUILDS) -> Path:
    """<base>/<digest>, made by ``build(folder)`` unless it is there already.

    A build goes to a temporary folder beside the final one, renamed into place when complete, so a
    killed build never leaves a half-written image where it would be used; a later call removes the
    temporary folders of builders that are gone. Processes that want the same build at once (the
    pytest-xdist workers of `make test`, whose first modules all start nodes) take turns on a lock
    of that digest: one builds, the others find its build done instead of each making its own on
    the same two cores. Each use marks the build as used now; a new build removes all but the
    ``keep`` most recently used, so the cache stays bounded however many commits are tested.
    """
    final = base / digest
    if final.is_dir():
        os.utime(final)
        return final
    base.mkdir(parents=True, exist_ok=True)
    lock_path = base / f"{_LOCK}{digest}"
    with lock_path.open("a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if final.is_dir():  # built by the process that held the lock before
            os.utime(final)
            return final
        try:
            return _build_into(base, final, build, keep)
        finally:
            # Whoever waits on it looks for the build once it has the lock; whoever comes later
            # finds the build (or, if this one failed, builds it).
            lock_path.unlink(missing_ok=True)


def _build_into(base: Path, final: Path, build: Callable[[Path], object], keep: int) -> Path:
    _remove_abandoned_builds(base)
    partial = Path(tempfile.mkdtemp(prefix=f"{_BUILDING}{os.getpid()}-", dir=base))
    try:
        build(partial)
        partial.chmod(0o755)  # mkdtemp made it private
        try:
            partial.rename(final)
        except OSError:
            if not final.is_dir():  # not "another process was first"
                raise
    finally:
        shutil.rmtree(partial, ignore_errors=True)
    os.utime(final)
    _remove_least_recently_used(base, keep)
    return final


def _remove_least_recently_used(base: Path, keep: int) -> None:
    """Remove the finished builds under ``base`` past the ``keep`` used most recently."""
    used_at: dict[Path, float] = {}
    for folder in base.iterdir():
        with contextlib.suppress(FileNotFoundError):  # another process's prune got there first
            if folder.is_dir() and not folder.name.startswith(_BUILDING):
                used_at[folder] = folder.stat().st_mtime
    for stale in sorted(used_at, key=used_at.__getitem__, reverse=True)[keep:]:
        shutil.rmtree(stale, ignore_errors=True)


def _remove_abandoned_builds(base: Path) -> None:
    """Remove the temporary folders of standard_images builds whose process no longer runs."""
    for folder in base.glob(f"{_BUILDING}*"):
        pid = folder.name.removeprefix(_BUILDING).partition("-")[0]
        if pid.isdigit() and not _process_exists(int(pid)):
            shutil.rmtree(folder, ignore_errors=True)


def _process_exists(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def import_image(ctr: Path, containerd_socket: Path, archive: Path) -> None:
    """Load an archive into a containerd's `k8s.io` namespace (the one its CRI plugin serves) and
    unpack it for the default snapshotter, so the kubelet finds it present and never pulls."""
    run_checked(
        [
            ctr,
            "--address",
            containerd_socket,
            "--namespace",
            "k8s.io",
            "images",
            "import",
            "--platform",
            f"linux/{_oci_architecture()}",
            archive,
        ],
        timeout=120,
    )
