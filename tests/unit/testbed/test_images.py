"""Images built from local files are valid OCI image layouts, reproducible, and self-contained."""

from __future__ import annotations

import hashlib
import io
import json
import os
import tarfile
import threading
import time
from pathlib import Path

import pytest

from testbed import images
from testbed.images import ImageSpec, build_image, host_program, layer_bytes, shared_libraries


def read_layout(archive: Path) -> dict[str, bytes]:
    files: dict[str, bytes] = {}
    with tarfile.open(archive) as tar:
        for member in tar.getmembers():
            extracted = tar.extractfile(member)
            if extracted is not None:
                files[member.name] = extracted.read()
    return files


def test_layers_are_reproducible(tmp_path: Path) -> None:
    """The same files give byte-identical layers (sorted entries, zero mtimes, root owner): two
    copies of the same files, with different modification times, different owners (when the
    test runs as root; otherwise the files' owner is not root) and given in a different order,
    make the same bytes, and every entry of the layer has mtime 0 and owner root:root, files in
    name order."""
    copies = []
    for name, stamp in (("a", 1_000_000), ("b", 2_000_000_000)):
        folder = tmp_path / name
        folder.mkdir()
        program, data = folder / "hello", folder / "data"
        program.write_text("#!/bin/sh\necho hello\n")
        program.chmod(0o755)
        data.write_text("payload\n")
        for path in (program, data):
            os.utime(path, (stamp, stamp))
        copies.append((program, data))
    if os.geteuid() == 0:
        for path in copies[1]:
            os.chown(path, 1234, 5678)
    (program_a, data_a), (program_b, data_b) = copies
    first = layer_bytes({"/bin/hello": program_a, "/etc/data": data_a})
    second = layer_bytes({"/etc/data": data_b, "/bin/hello": program_b})
    assert first == second
    with tarfile.open(fileobj=io.BytesIO(first)) as tar:
        members = tar.getmembers()
    assert [m.name for m in members if m.isfile()] == ["bin/hello", "etc/data"]
    assert all((m.mtime, m.uid, m.gid, m.uname, m.gname) == (0, 0, 0, "root", "root") for m in members)


def test_archive_is_an_oci_layout_named_for_containerd(tmp_path: Path) -> None:
    """index.json names the image for `ctr images import`; every blob's name is its SHA-256; the
    layer carries the program at its image path and the shared libraries it loads at their paths."""
    shell = host_program("sh")
    archive = build_image(ImageSpec("tessera.local/test:v1", {"/bin/sh": shell}), tmp_path)
    layout = read_layout(archive)
    (manifest_ref,) = json.loads(layout["index.json"])["manifests"]
    assert manifest_ref["annotations"]["io.containerd.image.name"] == "tessera.local/test:v1"
    for name, data in layout.items():
        if name.startswith("blobs/sha256/"):
            assert hashlib.sha256(data).hexdigest() == name.rsplit("/", 1)[1]
    manifest = json.loads(layout[f"blobs/sha256/{manifest_ref['digest'].split(':')[1]}"])
    (layer,) = manifest["layers"]
    with tarfile.open(fileobj=io.BytesIO(layout[f"blobs/sha256/{layer['digest'].split(':')[1]}"])) as tar:
        names = set(tar.getnames())
    assert "bin/sh" in names
    libraries = shared_libraries(shell)
    assert libraries, "the host shell should be dynamically linked"
    assert {str(lib).lstrip("/") for lib in libraries} <= names


def test_standard_images_are_built_once_into_the_cache_and_reused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The first call builds both archives into <cache>/images/<digest>/; the next reuses them without
    building. No temporary build folder is left, and those of dead builders are removed."""
    builds: list[Path] = []

    def fake_compile_pause(out_dir: Path) -> Path:  # no C compiler needed for this test
        out_dir.mkdir(parents=True, exist_ok=True)
        program = out_dir / "pause"
        program.write_bytes(b"not really a program")
        builds.append(out_dir)
        return program

    monkeypatch.setattr(images, "compile_pause", fake_compile_pause)
    abandoned = tmp_path / "images" / ".building-2147483647-x"  # no process has that PID
    abandoned.mkdir(parents=True)

    first = images.standard_images(tmp_path)
    second = images.standard_images(tmp_path)

    assert first == second
    assert [p.name for p in first] == ["tessera.local_pause_v1.tar", "tessera.local_tools_v1.tar"]
    assert all(p.is_file() and p.parent.parent == tmp_path / "images" for p in first)
    assert first[0].parent.name == images.standard_images_digest()
    assert len(builds) == 1
    assert sorted(p.name for p in (tmp_path / "images").iterdir()) == [first[0].parent.name]
    assert sorted(p.name for p in first[0].parent.iterdir()) == sorted(p.name for p in first)


def test_a_new_build_removes_all_but_the_most_recently_used(tmp_path: Path) -> None:
    """Each build or reuse marks a build as used; a new build leaves only the ``keep`` most recently
    used, so a cache keyed by the checkout's files does not grow by one build per commit. Builds
    still being written are not counted or touched."""
    built: list[str] = []

    def build(name: str) -> Path:
        def write(folder: Path) -> None:
            (folder / "image.tar").write_bytes(b"x")
            built.append(name)

        return images.cached_build(tmp_path, name, write, keep=2)

    in_progress = tmp_path / ".building-1-y"
    in_progress.mkdir(parents=True)
    for name in ("a", "b"):
        build(name)
    os.utime(tmp_path / "a", (1, 1))
    os.utime(tmp_path / "b", (2, 2))
    build("a")  # reused: now the most recently used
    build("c")  # new: "b" is the least recently used of three

    assert built == ["a", "b", "c"]
    assert sorted(p.name for p in tmp_path.iterdir()) == [".building-1-y", "a", "c"]


def test_processes_wanting_the_same_build_at_once_build_it_once(tmp_path: Path) -> None:
    """The xdist workers of `make test` all ask for the product images as their first modules start:
    one builds, the others wait on the digest's lock and find the build done."""
    started = threading.Event()
    release = threading.Event()
    builds: list[int] = []

    def write(folder: Path) -> None:
        builds.append(threading.get_ident())
        started.set()
        release.wait(30)
        (folder / "image.tar").write_bytes(b"x")

    results: list[Path] = []
    threads = [
        threading.Thread(target=lambda: results.append(images.cached_build(tmp_path, "d", write)))
        for _ in range(3)
    ]
    for thread in threads:
        thread.start()
    assert started.wait(30)
    time.sleep(0.2)  # the other two are waiting on the lock by now, or will find the build done
    release.set()
    for thread in threads:
        thread.join(30)
    assert len(builds) == 1
    assert results == [tmp_path / "d"] * 3
    assert (tmp_path / "d" / "image.tar").read_bytes() == b"x"
