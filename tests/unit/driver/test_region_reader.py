"""The usage region as the exporter reads it: a private pread copy that a tenant can make wrong but
never make fault, block or write.

The region is world-writable and mounted read-write into the claim's containers, so every shape a
container can give the file is tried here: truncated, grown, scribbled header and counts, a UUID
without its end, and the file replaced by a directory, a FIFO or a link. Each is one
:class:`RegionError` naming the file; the region on disk is never changed by reading it."""

from __future__ import annotations

import os
import struct
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tessera.shim import format as shim_format

HEADER = 64
GPU_SIZE = 192
SLOT_SIZE = 192
SLOTS_AT = HEADER + shim_format.MAX_GPUS * GPU_SIZE
UUID = "GPU-11111111-2222-3333-4444-555555555555"


@pytest.fixture
def region(tmp_path: Path) -> Path:
    return shim_format.create_region(tmp_path / "usage")


def poke(path: Path, offset: int, data: bytes) -> None:
    """Write bytes into the file as a tenant with a write descriptor could."""
    with open(path, "r+b") as f:
        f.seek(offset)
        f.write(data)


HOLDER = """
import sys
from tessera.shim._format import ffi, lib
h = ffi.new("struct tessera_region_handle *")
assert lib.tessera_region_open(sys.argv[1].encode(), h, ffi.NULL, 0) == 0
assert lib.tessera_region_claim_slot(h) >= 0
gpu = lib.tessera_region_gpu(h.map, sys.argv[2].encode())
assert lib.tessera_region_reserve(h, gpu, int(sys.argv[3]), 1 << 40) == 0
print("HOLD", flush=True)
sys.stdin.read()
"""


def hold(path: Path, nbytes: int) -> subprocess.Popen[str]:
    """A process that holds a slot of the region the shim's way (its record lock) with ``nbytes``
    reserved on UUID, until its stdin closes: a process of its own, since a record lock belongs to
    the process and closing any descriptor of the file would drop all of this one's."""
    process = subprocess.Popen(
        [sys.executable, "-c", HOLDER, str(path), UUID, str(nbytes)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert process.stdout is not None
    assert process.stdout.readline() == "HOLD\n"
    return process


@pytest.fixture
def holders() -> Iterator[list[subprocess.Popen[str]]]:
    made: list[subprocess.Popen[str]] = []
    yield made
    for process in made:
        process.kill()
        process.wait()


def test_a_live_slot_counts_and_a_dead_one_does_not_without_the_reader_writing(
    region: Path, holders: list[subprocess.Popen[str]]
) -> None:
    live = hold(region, 100)
    dead = hold(region, 40)
    holders.extend([live, dead])
    dead.kill()  # SIGKILL: no exit handler runs, the slot stays ACTIVE with its bytes
    dead.wait()
    before = region.read_bytes()

    snapshot = shim_format.read_region(region)
    assert [(g.uuid, g.used_bytes) for g in snapshot.gpus] == [(UUID, 100)]
    assert [(p.pid, p.used_bytes) for p in snapshot.processes] == [(live.pid, {UUID: 100})]
    as_left = shim_format.read_region(region, include_dead=True)
    assert [(g.uuid, g.used_bytes) for g in as_left.gpus] == [(UUID, 140)]
    assert sorted(p.pid for p in as_left.processes) == sorted([live.pid, dead.pid])
    assert region.read_bytes() == before  # no sweep, no lock taken: the file is as it was


def test_a_missing_region_is_file_not_found_not_a_malformed_one(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError):
        shim_format.read_region(tmp_path / "usage")


def size_of(path: Path) -> int:
    return path.stat().st_size


def mark_slot_9(path: Path) -> None:
    """Slots up to 10 in use, slot 9 with a state no shim writes."""
    poke(path, 24, struct.pack("=I", 10))
    poke(path, SLOTS_AT + 9 * SLOT_SIZE, struct.pack("=I", 3))


@pytest.mark.parametrize(
    ("change", "reason"),
    [
        (lambda p: os.truncate(p, 0), "0 bytes, not the"),
        (lambda p: os.truncate(p, SLOTS_AT + 3 * SLOT_SIZE + 17), "bytes, not the"),
        (lambda p: os.truncate(p, size_of(p) + 1), "bytes, not the"),
        (lambda p: poke(p, 0, b"GARBAGE!"), "bad magic"),
        (lambda p: poke(p, 8, struct.pack("=I", 2)), "header says version 2"),
        (lambda p: poke(p, 12, struct.pack("=I", 12)), "size 12"),
        (lambda p: poke(p, 24, struct.pack("=I", 0xFFFFFFFF)), "slot_hwm 4294967295"),
        (lambda p: poke(p, HEADER + 5 * GPU_SIZE, struct.pack("=I", 7)), "GPU entry 5 has state 7"),
        (
            lambda p: poke(p, HEADER + GPU_SIZE, struct.pack("=II", 2, 0) + b"G" * 80),
            "GPU entry 1 has a UUID without an end",
        ),
        (mark_slot_9, "slot 9 has state 3"),
    ],
    ids=[
        "truncated-to-0",
        "truncated-mid-slot",
        "grown",
        "bad-magic",
        "bad-version",
        "bad-size-field",
        "slot-hwm-huge",
        "gpu-state",
        "uuid-without-nul",
        "slot-state",
    ],
)
def test_a_region_shaped_by_a_tenant_is_one_error_naming_the_file(
    region: Path, change: object, reason: str
) -> None:
    assert callable(change)
    change(region)
    with pytest.raises(shim_format.RegionError, match=reason) as raised:
        shim_format.read_region(region)
    assert str(region) in str(raised.value)


def test_a_directory_in_the_regions_place_is_refused(region: Path) -> None:
    region.unlink()
    region.mkdir()
    with pytest.raises(shim_format.RegionError, match="not a regular file"):
        shim_format.read_region(region)


def test_a_fifo_in_the_regions_place_is_refused_without_blocking(region: Path) -> None:
    """Opening a FIFO for reading blocks until a writer comes, unless it is opened non-blocking:
    with no writer ever coming, a blocking reader would hang this test for good."""
    region.unlink()
    os.mkfifo(region)
    with pytest.raises(shim_format.RegionError, match="not a regular file"):
        shim_format.read_region(region)


def test_a_link_in_the_regions_place_is_not_followed(region: Path, tmp_path: Path) -> None:
    """A link could name any file the reader may open; the region is always a plain file."""
    target = tmp_path / "elsewhere"
    region.rename(target)
    region.symlink_to(target)
    with pytest.raises(shim_format.RegionError, match="cannot open"):
        shim_format.read_region(region)
