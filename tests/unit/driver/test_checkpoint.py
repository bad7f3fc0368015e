"""The checkpoint survives restarts, upgrades and damage without ever stopping the daemon."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest

from tessera.driver import checkpoint
from tessera.driver.checkpoint import (
    PREPARE_COMPLETED,
    PREPARE_STARTED,
    Checkpoint,
    ClaimRecord,
    PreparedDevice,
)

DEVICE = PreparedDevice(("gpu",), "node-a", "gpu-a", ("k8s.gpu.tessera.dev/claim=u1-gpu-a-s1",), "s1")


def sample() -> Checkpoint:
    return Checkpoint(
        "boot-1",
        {
            "u1": ClaimRecord("u1", "ns", "c1", PREPARE_COMPLETED, (DEVICE,)),
            "u2": ClaimRecord("u2", "ns", "c2", PREPARE_STARTED, ()),
        },
    )


def test_a_saved_checkpoint_reads_back_the_same(tmp_path: Path) -> None:
    path = tmp_path / "checkpoint.json"
    checkpoint.save(path, sample())
    loaded = checkpoint.load(path, "boot-1")
    assert loaded.rebuild is None
    assert loaded.checkpoint == sample()
    assert path.stat().st_mode & 0o777 == 0o600


def test_no_file_is_an_empty_checkpoint_and_nothing_to_rebuild(tmp_path: Path) -> None:
    loaded = checkpoint.load(tmp_path / "absent.json", "boot-1")
    assert loaded.checkpoint.claims == {} and loaded.rebuild is None


@pytest.mark.parametrize(
    ("damage", "reason"),
    [
        (lambda text: text[: len(text) // 2], "not JSON"),
        (lambda text: text.replace('"c1"', '"cX"'), "checksum mismatch"),
        (
            lambda text: text.replace('"version": 1', '"version": 99'),
            "version 99 is not one this driver reads",
        ),
        (lambda text: "[]", "not a checkpoint object"),
    ],
    ids=["cut-short", "edited", "from-the-future", "wrong-shape"],
)
def test_an_unreadable_file_is_quarantined_and_asks_for_a_rebuild(
    tmp_path: Path, damage: Callable[[str], str], reason: str
) -> None:
    path = tmp_path / "checkpoint.json"
    checkpoint.save(path, sample())
    path.write_text(damage(path.read_text()))
    loaded = checkpoint.load(path, "boot-1")
    assert loaded.checkpoint.claims == {}
    assert loaded.rebuild is not None and reason in loaded.rebuild
    assert not path.exists()
    quarantined = list(tmp_path.glob("checkpoint.json.quarantined-*"))
    assert len(quarantined) == 1


def test_a_checkpoint_from_another_boot_is_not_trusted(tmp_path: Path) -> None:
    path = tmp_path / "checkpoint.json"
    checkpoint.save(path, sample())
    loaded = checkpoint.load(path, "boot-2")
    assert loaded.checkpoint.claims == {} and loaded.checkpoint.boot_id == "boot-2"
    assert loaded.rebuild is not None and "rebooted" in loaded.rebuild


def test_fields_a_newer_writer_added_do_not_make_the_file_look_corrupt(tmp_path: Path) -> None:
    """The checksum covers the data as stored, not as this version would re-encode it (nv#1080)."""
    document = json.loads(checkpoint.encode(sample()))
    document["data"]["claims"]["u1"]["addedLater"] = {"x": 1}
    document["checksum"] = checkpoint._checksum(document["data"])
    path = tmp_path / "checkpoint.json"
    path.write_text(json.dumps(document))
    loaded = checkpoint.load(path, "boot-1")
    assert loaded.rebuild is None
    assert loaded.checkpoint.claims["u1"].devices == (DEVICE,)
