"""What the dockerfile tier's builder decides without building: which step images a build used,
what a prune keeps, how the images and the base are named. The build itself is the dockerfile tier's
(tests/dockerfile)."""

from __future__ import annotations

from pathlib import Path

import pytest

from testbed import debian_base, dockerfile_images
from testbed.buildah import Buildah, StoredContainer, StoredImage

BUILD_OUTPUT = """[1/3] STEP 2/6: RUN apt-get update
--> Using cache e8926e7fe2fc20e3da514bdf3d332e97242a9b8d02ff46feab3f7f847b79d0ef
--> e8926e7fe2f
[1/3] STEP 5/6: RUN pip wheel
Successfully built tessera
--> 746f08280b4
[3/3] COMMIT localhost/tessera-driver:abc
--> 3750976f88b
Successfully tagged localhost/tessera-driver:abc
3750976f88bbffae2ff9f276fd4b9fc3410012888804ebb4510a6c6f83454a16
"""


def test_the_steps_of_a_build_are_every_image_it_reports_made_or_reused() -> None:
    assert dockerfile_images.step_images(BUILD_OUTPUT) == {
        "e8926e7fe2fc20e3da514bdf3d332e97242a9b8d02ff46feab3f7f847b79d0ef",
        "e8926e7fe2f",
        "746f08280b4",
        "3750976f88b",
    }


def test_a_prune_keeps_the_images_named_and_their_check_containers_only(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Kept: the images whose ID starts with a kept (maybe shortened) ID, and each one's check
    container; removed: every other container (a failed build's working container among them),
    then every other image."""
    kept, older, leftover = "a" * 64, "b" * 64, "c" * 64
    images = [
        StoredImage(kept, ("localhost/tessera-driver:new",)),
        StoredImage(older, ()),
        StoredImage(leftover, ()),
    ]
    containers = [
        StoredContainer("1", f"{dockerfile_images.check_container_name(kept)}-41", kept),
        StoredContainer("2", f"{dockerfile_images.check_container_name(older)}-42", older),
        StoredContainer("3", "cccccccccccc-working-container", leftover),
    ]
    ran: list[tuple[str, ...]] = []
    monkeypatch.setattr(Buildah, "images", lambda self: images)
    monkeypatch.setattr(Buildah, "containers", lambda self: containers)

    def record(self: Buildah, *args: object, **_: object) -> str:
        ran.append(tuple(map(str, args)))
        return ""

    monkeypatch.setattr(Buildah, "__call__", record)
    dockerfile_images.prune(Buildah(tmp_path), {kept[:11]})
    assert ran == [("rm", "2", "3"), ("rmi", "--force", older, leftover)]


def test_each_target_is_named_after_its_repository_and_tagged_with_the_digest() -> None:
    names = dockerfile_images.references("0123456789abcdef" * 4)
    assert names == {
        "driver": "localhost/tessera-driver:0123456789abcdef",
        "webhook": "localhost/tessera-webhook:0123456789abcdef",
    }


def test_the_base_is_debian_12s_minbase_trimmed_as_the_slim_image_is() -> None:
    arguments = debian_base.mmdebstrap_arguments()
    assert arguments[-1] == "bookworm"
    assert "--variant=minbase" in arguments
    assert "path-exclude=/usr/share/doc/*" in arguments
    assert "path-include=/usr/share/doc/*/copyright" in arguments
    assert all(" bookworm" in source for source in debian_base.SOURCES)
