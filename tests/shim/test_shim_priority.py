"""Task priority on a shared GPU (shim/src/priority.c): low-priority claims hold their launches
back while a high-priority claim on the same GPU has kernels in flight, and only then; the
priority board's contents are believed only within bounds, so a dead or lying high-priority
tenant cannot hold its neighbours back for ever; a low-priority claim never writes the board; and
caps still hold. (Latencies, with and without priority: benchmarks/shim/priority.py.)"""

from __future__ import annotations

import struct
import threading
import time
from pathlib import Path

import pytest

from tessera.shim.format import (
    BOARD_LINGER_NS,
    BOARD_MAX_AHEAD_NS,
    PRIORITY_ENV,
    PRIORITY_HIGH,
    PRIORITY_LOW,
    GpuLimit,
    RegionError,
    create_board,
    now_ns,
    read_board,
    read_limits,
    read_region,
    write_limits,
)
from testbed.shim_harness import Claim, ClaimFactory, values

# Shares of time are measured: no other test may share the CPUs (tests/conftest.py).
pytestmark = pytest.mark.alone

BOARD = struct.Struct("=8sIIQQQ24s")


def with_priority(claim: Claim, boards: Path, priority: int) -> tuple[Claim, Path]:
    """``claim`` given ``priority`` on its GPU and that GPU's board (created) under ``boards``."""
    assert claim.limits is not None
    limits = read_limits(claim.limits)
    assert limits is not None
    write_limits(claim.limits, [GpuLimit(g.uuid, g.memory_bytes, g.cores, priority) for g in limits])
    boards.mkdir(exist_ok=True)
    board = create_board(boards / limits[0].uuid)
    claim.extra_env[PRIORITY_ENV] = str(boards)
    return claim, board


def held(claim: Claim) -> tuple[int, int]:
    assert claim.region is not None
    (gpu,) = read_region(claim.region).gpus
    return gpu.holds, gpu.held_ns


def scribble(board: Path, heartbeat: int, busy_until: int) -> None:
    """Write the board as a high-priority tenant can: any values at all."""
    board.write_bytes(BOARD.pack(b"TSRPRI1\0", 1, 64, heartbeat, busy_until, 0, b"\0" * 24))


def test_board_is_created_once_and_kept(tmp_path: Path) -> None:
    """A new board holds no one; creating it again keeps what is there (containers have that
    inode mounted), even a board a writer scribbled on, which then reads as no board; something
    other than a file at the path is refused."""
    board = create_board(tmp_path / "GPU-1")
    assert (board.stat().st_mode & 0o777) == 0o666
    first = read_board(board)
    assert first is not None and first.hold_until_ns == 0 and first.high_launches == 0
    scribble(board, 5, 6)
    create_board(board)
    assert read_board(board) == first.__class__(5, 6, 0, 0)
    for junk in (b"", b"x" * 64, b"TSRPRI1\0" + b"\0" * 10):
        board.write_bytes(junk)
        create_board(board)
        assert read_board(board) is None and board.read_bytes() == junk
    board.unlink()
    board.mkdir()
    with pytest.raises(RegionError, match="not a regular file"):
        create_board(board)
    (tmp_path / "GPU-2").symlink_to(tmp_path / "elsewhere")
    with pytest.raises(RegionError, match="not a regular file"):
        create_board(tmp_path / "GPU-2")


def test_what_a_reader_believes_is_bounded(tmp_path: Path) -> None:
    """A heartbeat in the future is ignored; a busy-until far ahead counts only MAX_AHEAD past the
    heartbeat; a hold ends LINGER after the busy-until; an old heartbeat holds no one."""
    board = create_board(tmp_path / "GPU-1")
    now = now_ns()
    scribble(board, now + 60_000_000_000, now + 60_000_000_000)
    assert read_board(board).hold_until_ns == 0  # type: ignore[union-attr]
    scribble(board, now, now + 3600_000_000_000)
    assert read_board(board).hold_until_ns == now + BOARD_MAX_AHEAD_NS + BOARD_LINGER_NS  # type: ignore[union-attr]
    scribble(board, now - 10_000_000_000, now - 10_000_000_000)
    assert read_board(board).hold_until_ns == 0  # type: ignore[union-attr]
    scribble(board, now, now + 20_000_000)
    assert read_board(board).hold_until_ns == now + 20_000_000 + BOARD_LINGER_NS  # type: ignore[union-attr]


def test_low_priority_launches_are_held_while_high_priority_kernels_run(
    make_claim: ClaimFactory, tmp_path: Path
) -> None:
    """A busy low-priority claim holds its launches back while a high-priority claim on the same
    GPU runs kernels; alone (before and after) it is never held; the high-priority claim is
    never held and publishes every launch; the low-priority one never writes the board."""
    boards = tmp_path / "boards"
    high, board = with_priority(make_claim(limits=[(0, None, 0)], name="high"), boards, PRIORITY_HIGH)
    low, _ = with_priority(make_claim(limits=[(0, None, 0)], name="low"), boards, PRIORITY_LOW)

    alone = low.run("shim_probe", "duty", "1000000", "0.3", "2")
    assert alone.returncode == 0, alone.stderr
    assert held(low) == (0, 0)
    assert read_board(board).high_launches == 0  # type: ignore[union-attr]

    busy = high.start("shim_probe", "duty", "2000000", "1.5", "2")
    while read_board(board).high_launches == 0:  # type: ignore[union-attr]
        assert busy.poll() is None, busy.communicate()
        time.sleep(0.01)
    during = low.run("shim_probe", "duty", "1000000", "0.5", "2")
    out, err = busy.communicate(timeout=60)
    assert busy.returncode == 0 and during.returncode == 0, (err, during.stderr)
    holds, held_ns = held(low)
    assert holds > 0 and held_ns > 0
    assert held(high) == (0, 0)
    assert read_board(board).high_launches == int(values(out)["launched"])  # type: ignore[union-attr]

    # The high-priority claim has stopped: its hold has expired and the low one runs freely.
    while read_board(board).hold_until_ns != 0:  # type: ignore[union-attr]
        time.sleep(0.01)
    after = low.run("shim_probe", "duty", "1000000", "0.3", "2")
    assert after.returncode == 0, after.stderr
    assert held(low) == (holds, held_ns)


def test_a_dead_or_lying_high_priority_tenant_holds_no_one_for_ever(
    make_claim: ClaimFactory, tmp_path: Path
) -> None:
    """A board left saying "busy for an hour" (a high-priority process killed mid-burst, or one
    writing whatever it likes) holds a low-priority claim back only until the bounded hold
    expires: its launches then run, and one that comes later is not held at all."""
    low, board = with_priority(
        make_claim(limits=[(0, None, 0)], name="low"), tmp_path / "boards", PRIORITY_LOW
    )
    now = now_ns()
    scribble(board, now, now + 3600_000_000_000)
    first = low.run("shim_probe", "duty", "1000000", "0.2", "2")
    assert first.returncode == 0, first.stderr
    holds, _ = held(low)
    assert holds >= 1
    assert int(values(first.stdout)["launched"]) > 1
    while read_board(board).hold_until_ns != 0:  # type: ignore[union-attr]
        time.sleep(0.01)
    again = low.run("shim_probe", "duty", "1000000", "0.2", "2")
    assert again.returncode == 0, again.stderr
    assert held(low)[0] == holds


def test_a_board_that_is_not_one_holds_no_one_and_faults_no_one(
    make_claim: ClaimFactory, tmp_path: Path
) -> None:
    """A high-priority tenant that truncates the board (which would fault every process that had
    mapped it) or fills it with junk: low-priority processes run on, unheld, and the next
    high-priority launch writes a whole board again."""
    boards = tmp_path / "boards"
    low, board = with_priority(make_claim(limits=[(0, None, 0)], name="low"), boards, PRIORITY_LOW)
    high, _ = with_priority(make_claim(limits=[(0, None, 0)], name="high"), boards, PRIORITY_HIGH)
    for junk in (b"", b"\xff" * 64):
        board.write_bytes(junk)
        done = low.run("shim_probe", "duty", "1000000", "0.1", "2")
        assert done.returncode == 0, done.stderr
        assert held(low) == (0, 0)
        done = high.run("shim_probe", "duty", "1000000", "0.1", "2")
        assert done.returncode == 0, done.stderr
        healed = read_board(board)
        assert healed is not None and healed.high_launches == int(values(done.stdout)["launched"])


def test_caps_hold_with_priority(make_claim: ClaimFactory, tmp_path: Path) -> None:
    """A high-priority claim capped at 30 % is still capped at 30 % (within the compute tests'
    3 points); priority changes who waits, not how much either may take."""
    boards = tmp_path / "boards"
    high, _ = with_priority(make_claim(limits=[(0, None, 30)], name="high"), boards, PRIORITY_HIGH)
    low, _ = with_priority(make_claim(limits=[(0, None, 40)], name="low"), boards, PRIORITY_LOW)
    procs = [c.start("shim_probe", "duty", "2000000", "2.0", "4") for c in (high, low)]
    shares = []
    for p in procs:
        out, err = p.communicate(timeout=120)
        assert p.returncode == 0, err
        shares.append(float(values(out)["share"]))
    assert shares[0] <= 30 + 3 and shares[1] <= 40 + 3, shares


def test_without_boards_priority_changes_nothing(make_claim: ClaimFactory) -> None:
    """A limits file that says priority 0 but no board to publish on (outside a container, no
    $TESSERA_PRIORITY_DIR): the claim runs as before, uncapped launches untouched."""
    claim = make_claim(limits=[(0, None, 0)])
    assert claim.limits is not None
    (limit,) = read_limits(claim.limits) or []
    write_limits(claim.limits, [GpuLimit(limit.uuid, None, 0, PRIORITY_HIGH)])
    done = claim.run("shim_probe", "duty", "1000000", "0.1", "2")
    assert done.returncode == 0 and "priority board" not in done.stderr, done.stderr


def test_threads_of_one_process_creating_one_board_at_once_all_succeed(tmp_path: Path) -> None:
    """Two claims prepared at once on one GPU create its board from two threads of the daemon (one
    pid): every call succeeds and one whole board is left, with no temporary file beside it."""
    path = tmp_path / "GPU-board"
    failures: list[BaseException] = []

    def create() -> None:
        try:
            create_board(path)
        except BaseException as error:
            failures.append(error)

    for _ in range(20):
        path.unlink(missing_ok=True)
        threads = [threading.Thread(target=create) for _ in range(8)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        assert failures == []
        assert read_board(path) is not None
    assert sorted(p.name for p in tmp_path.iterdir()) == ["GPU-board"]
