"""Reading an OCI image-layout archive (as testbed/images.py writes them) without a container engine:
its configuration, the paths of every layer and the text of chosen files."""

from __future__ import annotations

import json
import tarfile
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import IO, Any


@dataclass(frozen=True)
class ArchiveImage:
    config: dict[str, Any]
    """The image configuration's ``config`` object: Entrypoint, User, Env, WorkingDir."""
    paths: list[PurePosixPath]
    """Every path in every layer, folders included."""
    files: list[PurePosixPath]
    """The paths in every layer that are not folders."""
    texts: dict[str, str]
    """The text of each file asked for that a layer holds, by its path in the layer."""


def read_archive(archive: Path, texts: Iterable[str] = ()) -> ArchiveImage:
    """The one image of ``archive``; ``texts``: the layer paths of files to read."""
    wanted = set(texts)
    with tarfile.open(archive) as outer:

        def read(name: str) -> IO[bytes]:
            extracted = outer.extractfile(name)
            assert extracted is not None, name
            return extracted

        def blob(digest: str) -> IO[bytes]:
            return read(f"blobs/sha256/{digest.removeprefix('sha256:')}")

        [descriptor] = json.loads(read("index.json").read())["manifests"]
        manifest = json.loads(blob(descriptor["digest"]).read())
        config = json.loads(blob(manifest["config"]["digest"]).read())["config"]
        paths: list[PurePosixPath] = []
        files: list[PurePosixPath] = []
        found: dict[str, str] = {}
        for layer in manifest["layers"]:
            with tarfile.open(fileobj=blob(layer["digest"]), mode="r|") as members:
                for member in members:
                    paths.append(PurePosixPath(member.name))
                    if not member.isdir():
                        files.append(PurePosixPath(member.name))
                    if member.name in wanted:
                        extracted = members.extractfile(member)
                        assert extracted is not None
                        found[member.name] = extracted.read().decode()
    return ArchiveImage(config, paths, files, found)
