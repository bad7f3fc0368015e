"""images/Dockerfile built as a user builds it: by a container builder (buildah, no daemon), from
the repository root, one image per target, on a Debian 12 base made from Debian's packages
(testbed/debian_base.py) passed as the Dockerfile's ``BASE``.

The images are built once per set of inputs: their tags are a digest of the Dockerfile, the build
context's files, the base and this builder, so a run whose inputs are unchanged builds nothing.
buildah's layer cache keeps the steps that come before the build context (the apt installs) from one
build to the next; after a build, the store keeps only the base, the new images and the steps this
build made or reused. The checks run in containers of their own (``check_container``), which the
session that made them removes, and a prune removes those of killed sessions.

The build stage's pip reaches PyPI with the host's TLS trust: where the host has a CA bundle, it is
mounted read-only among the build stage's local certificates (/usr/local/share/ca-certificates),
which its ca-certificates package (a dependency of Debian's pip) adds to the bundle pip reads; so a
proxy the host trusts (some CI machines re-sign TLS) is trusted there too. The runtime stages are
built without it, so none of it reaches the images.
"""

from __future__ import annotations

import hashlib
import os
import re
import sys
from collections.abc import Mapping
from pathlib import Path

from testbed.binaries import cache_root
from testbed.buildah import Buildah
from testbed.debian_base import debian_base
from testbed.product_images import DOCKERFILE, REPO, context_digest, load_manifest

# The host's CA bundle, and where the build stage's update-ca-certificates takes it in.
CA_BUNDLE = Path("/etc/ssl/certs/ca-certificates.crt")
BUILD_CA = "/usr/local/share/ca-certificates/tessera-host-trust.crt"
# The Dockerfile's stage that builds the wheel and the environment (the only one that uses PyPI).
BUILD_STAGE = "build"
# A step's image in buildah's output: "--> Using cache <id>" or "--> <id>".
_STEP = re.compile(r"^--> (?:Using cache )?([0-9a-f]{11,64})$", re.M)
_CHECK_PREFIX = "tessera-check-"
_BUILD_TIMEOUT = 2400


def store() -> Buildah:
    return Buildah(cache_root() / "dockerfile-images")


def dockerfile_digest(buildah: Buildah, base: str) -> str:
    """A digest of what the images are made of: the Dockerfile, the build context, the base
    image's ID, this builder and buildah's version."""
    digest = hashlib.sha256()
    parts = [
        DOCKERFILE.read_bytes(),
        context_digest().encode(),
        str(buildah.image_id(base)).encode(),
        Path(__file__).read_bytes(),
        buildah("version").encode(),
    ]
    for part in parts:
        digest.update(hashlib.sha256(part).digest())
    return digest.hexdigest()


def references(digest: str) -> dict[str, str]:
    """Each Dockerfile target's image name in the store (the manifest's repository)."""
    images = load_manifest().images
    return {name: f"localhost/{image.repository}:{digest[:16]}" for name, image in images.items()}


def bud(buildah: Buildah, base: str, target: str, *extra: str) -> set[str]:
    """Build one target of the Dockerfile with the layer cache; the IDs of the step images it made
    or reused."""
    output = buildah(
        "build",
        "--layers",
        "--force-rm",
        "--pull=never",
        "--isolation",
        "chroot",
        "--build-arg",
        f"BASE={base}",
        "--file",
        DOCKERFILE,
        "--target",
        target,
        *extra,
        REPO,
        timeout=_BUILD_TIMEOUT,
    )
    return step_images(output)


def step_images(output: str) -> set[str]:
    """The image IDs (full or shortened) of the steps a ``buildah build`` output reports."""
    return set(_STEP.findall(output))


def build(buildah: Buildah, base: str, targets: Mapping[str, str]) -> set[str]:
    """Build the build stage (with the host's CA bundle, where it has one), then every target (its
    steps of the build stage all cached); return the IDs of every step image used."""
    trust = ["--volume", f"{CA_BUNDLE}:{BUILD_CA}:ro"] if CA_BUNDLE.is_file() else []
    steps = bud(buildah, base, BUILD_STAGE, *trust)
    for target, reference in targets.items():
        steps |= bud(buildah, base, target, "--tag", reference)
    return steps


def check_container_name(image_id: str) -> str:
    return f"{_CHECK_PREFIX}{image_id[:16]}"


def check_container(buildah: Buildah, reference: str) -> str:
    """A container for this process to read and run an image in; ``buildah rm`` it when done
    (which unmounts it, whatever its runs left mounted)."""
    image_id = buildah.image_id(reference)
    assert image_id is not None, f"no image {reference} in {buildah.store}"
    return buildah.container(reference, f"{check_container_name(image_id)}-{os.getpid()}")


def prune(buildah: Buildah, keep: set[str]) -> None:
    """Remove every container but the check containers of the images kept (another test run may be
    using them), then every image whose ID does not start with one of ``keep`` (step IDs come
    shortened)."""
    kept = [image.id for image in buildah.images() if any(image.id.startswith(k) for k in keep)]
    wanted = tuple(check_container_name(image_id) for image_id in kept)
    stale = [c.id for c in buildah.containers() if not c.name.startswith(wanted)]
    if stale:
        buildah("rm", *stale)
    unwanted = [image.id for image in buildah.images() if image.id not in kept]
    if unwanted:
        buildah("rmi", "--force", *unwanted)


def dockerfile_images() -> dict[str, str]:
    """Each Dockerfile target's image in the store (target -> name), built first if its inputs
    changed."""
    buildah = store()
    with buildah.locked():
        base = debian_base(buildah)
        targets = references(dockerfile_digest(buildah, base))
        if all(buildah.image_id(reference) for reference in targets.values()):
            return targets
        steps = build(buildah, base, targets)
        finals = {buildah.image_id(reference) for reference in targets.values()}
        prune(buildah, {str(buildah.image_id(base)), *steps, *(str(f) for f in finals)})
        return targets


def main() -> int:
    if os.geteuid() != 0:
        print("building images/Dockerfile here needs root (mmdebstrap, buildah's overlay store)")
        return 1
    for target, reference in dockerfile_images().items():
        print(f"{target}\t{reference}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
