"""A Debian 12 (bookworm) base image made from Debian's packages, for building images/Dockerfile
where no image registry is reachable.

mmdebstrap installs the ``minbase`` variant (essential and required packages, apt) from Debian's
mirrors, with the same sources (bookworm, bookworm-updates, bookworm-security) and the same trimming
as the official ``debian:bookworm-slim`` (no manuals, documentation but the copyright files, or
translations; apt keeps that setting for later installs); buildah imports the tree as a one-layer
image with that image's configuration (PATH, ``bash``). It is made once per set of these arguments
and kept in the store; the packages are those of the day it was made (delete the store to refresh).
"""

from __future__ import annotations

import hashlib
import tempfile
from pathlib import Path

from testbed.buildah import Buildah
from testbed.commands import run_checked

SUITE = "bookworm"
SOURCES = (
    "deb http://deb.debian.org/debian bookworm main",
    "deb http://deb.debian.org/debian bookworm-updates main",
    "deb http://deb.debian.org/debian-security bookworm-security main",
)
# What debian:bookworm-slim leaves out, as dpkg path filters (written into the image for apt too).
SLIM_FILTERS = (
    "path-exclude=/usr/share/man/*",
    "path-exclude=/usr/share/info/*",
    "path-exclude=/usr/share/doc/*",
    "path-include=/usr/share/doc/*/copyright",
    "path-exclude=/usr/share/locale/*",
    "path-exclude=/usr/share/groff/*",
    "path-exclude=/usr/share/lintian/*",
)
CONFIG = (
    "--env",
    "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
    "--cmd",
    "bash",
)
REPOSITORY = "localhost/tessera-debian"
_TIMEOUT = 1800


def mmdebstrap_arguments() -> list[str]:
    """mmdebstrap's arguments but the output file: what the base is made of."""
    filters = [arg for rule in SLIM_FILTERS for arg in ("--dpkgopt", rule)]
    return ["--variant=minbase", "--mode=root", "--format=tar", *filters, SUITE]


def base_reference() -> str:
    """The base's name in the store: its tag is a digest of how it is made."""
    digest = hashlib.sha256()
    version = run_checked(["mmdebstrap", "--version"], timeout=60)
    for part in [version, *mmdebstrap_arguments(), *SOURCES, *CONFIG]:
        digest.update(part.encode() + b"\0")
    return f"{REPOSITORY}:{SUITE}-{digest.hexdigest()[:16]}"


def debian_base(buildah: Buildah) -> str:
    """The base's reference, made first if the store does not hold it."""
    reference = base_reference()
    if buildah.image_id(reference) is None:
        with tempfile.TemporaryDirectory(prefix="tessera-debian-") as work:
            tarball = Path(work) / "rootfs.tar"
            run_checked(["mmdebstrap", *mmdebstrap_arguments(), tarball, *SOURCES], timeout=_TIMEOUT)
            container = buildah("from", "scratch").strip()
            buildah("add", container, tarball, "/", timeout=_TIMEOUT)
            buildah("config", *CONFIG, container)
            buildah("commit", "--rm", container, reference, timeout=_TIMEOUT)
    return reference
