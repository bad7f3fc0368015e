"""The one place the test bed runs buildah: a container builder that needs no daemon and no registry.

Everything goes to a private image store (``Buildah.store``, under the cache), so nothing the tests
build mixes with the machine's own containers/storage, and every command uses the same store,
overlay as storage driver (root) and chroot isolation: RUN steps and checks run as processes in a
chroot of the image, with no OCI runtime to install and the host's network (apt and pip reach their
mirrors as the host does).
"""

from __future__ import annotations

import fcntl
import hashlib
import json
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from testbed.commands import run_checked

_TIMEOUT = 120


@dataclass(frozen=True)
class StoredImage:
    id: str
    names: tuple[str, ...]


@dataclass(frozen=True)
class StoredContainer:
    id: str
    name: str
    image_id: str


@dataclass(frozen=True)
class Buildah:
    """buildah on the image store in ``store``."""

    store: Path

    @property
    def run_root(self) -> Path:
        """Mount and lock state, which must not outlive a reboot: under /run, one per store."""
        return Path("/run/tessera-buildah") / hashlib.sha256(str(self.store).encode()).hexdigest()[:12]

    def argv(self, *args: str | Path) -> list[str]:
        common = ["--root", str(self.store / "storage"), "--runroot", str(self.run_root)]
        return ["buildah", *common, "--storage-driver", "overlay", *map(str, args)]

    def __call__(self, *args: str | Path, timeout: float = _TIMEOUT) -> str:
        return run_checked(self.argv(*args), timeout=timeout)

    @contextmanager
    def locked(self) -> Iterator[None]:
        """Hold the store for one builder at a time (two test runs may share the cache)."""
        self.store.mkdir(parents=True, exist_ok=True)
        with (self.store / ".lock").open("w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            yield

    def images(self) -> list[StoredImage]:
        """Every image in the store, intermediate build steps included, with full IDs."""
        listed = json.loads(self("images", "--all", "--no-trunc", "--json")) or []
        return [StoredImage(i["id"].removeprefix("sha256:"), tuple(i.get("names") or ())) for i in listed]

    def image_id(self, name: str) -> str | None:
        """The ID of the image named ``name``, None when the store has none."""
        return next((image.id for image in self.images() if name in image.names), None)

    def containers(self) -> list[StoredContainer]:
        listed = json.loads(self("containers", "--all", "--json")) or []
        return [StoredContainer(c["id"], c["containername"], c["imageid"]) for c in listed]

    def config(self, image: str) -> dict[str, Any]:
        """The OCI configuration of an image (Entrypoint, User, Env, WorkingDir...)."""
        inspected = json.loads(self("inspect", "--type", "image", image))
        return dict(inspected["OCIv1"]["config"])

    def container(self, image: str, name: str) -> str:
        """A working container of ``image`` named ``name``: the one there is, else a new one."""
        for found in self.containers():
            if found.name == name:
                return found.id
        return self("from", "--pull=never", "--name", name, image).strip()

    def mount(self, container: str) -> Path:
        """The container's root file system, mounted on the host."""
        return Path(self("mount", container).strip())

    def run(self, container: str, argv: Sequence[str], env: Sequence[str] = ()) -> str:
        """Run ``argv`` in the container as its image says (user, environment, working folder)."""
        env_args = [arg for item in env for arg in ("--env", item)]
        return self("run", "--isolation", "chroot", *env_args, container, "--", *argv)
