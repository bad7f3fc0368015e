"""One daemon per state directory: a second one waits for the first, says who holds the directory,
and gives up with that sentence only when told to; a holder killed with SIGKILL frees it."""

from __future__ import annotations

import signal
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from tessera.driver.state_lock import StateDirectoryBusy, StateLock

HOLD = """
import sys, threading
from pathlib import Path
from tessera.driver.state_lock import StateLock
StateLock(Path(sys.argv[1])).acquire(threading.Event())
print("held", flush=True)
sys.stdin.read()
"""


def holder(state_dir: Path) -> subprocess.Popen[str]:
    process = subprocess.Popen(
        [sys.executable, "-c", HOLD, str(state_dir)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    assert process.stdout is not None and process.stdout.readline() == "held\n"
    return process


@pytest.mark.timeout(60)
def test_a_second_daemon_waits_names_the_holder_and_takes_the_lock_once_it_exits(tmp_path: Path) -> None:
    first = holder(tmp_path)
    try:
        with pytest.raises(
            StateDirectoryBusy, match=rf"another tessera-driver \(pid {first.pid}\) still holds"
        ):
            StateLock(tmp_path).acquire(threading.Event(), timeout=0.3, poll=0.1)
    finally:
        first.communicate("")
    second = StateLock(tmp_path)
    second.acquire(threading.Event(), timeout=0)
    second.release()


@pytest.mark.timeout(60)
def test_a_holder_killed_with_sigkill_leaves_nothing_to_clean_up(tmp_path: Path) -> None:
    first = holder(tmp_path)
    first.send_signal(signal.SIGKILL)
    first.wait()
    lock = StateLock(tmp_path)
    lock.acquire(threading.Event(), timeout=0)
    assert (tmp_path / "daemon.lock").read_text().strip().isdigit()
    lock.release()


@pytest.mark.timeout(60)
def test_a_stop_while_waiting_ends_the_wait_without_the_lock_and_without_an_error(tmp_path: Path) -> None:
    """A standby replaced before its turn came (a rollout undone) stops quietly: no lock, no raise."""
    first = holder(tmp_path)
    stop = threading.Event()
    threading.Timer(0.3, stop.set).start()
    try:
        lock = StateLock(tmp_path)
        assert lock.acquire(stop, poll=0.1) is False
        lock.release()  # nothing to let go of: safe
    finally:
        first.communicate("")
