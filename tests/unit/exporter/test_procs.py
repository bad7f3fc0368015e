"""Who a process is and how it is stopped, on real processes and the real /proc."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tessera.exporter import procs

PROC = Path("/proc")


@pytest.fixture
def child() -> Iterator[subprocess.Popen[bytes]]:
    process = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    yield process
    process.kill()
    process.wait(timeout=10)


def test_a_processs_identity_is_its_own_namespaces_pid_its_start_time_and_its_name(
    child: subprocess.Popen[bytes],
) -> None:
    found = procs.identity(PROC, child.pid)
    assert found is not None
    # This test runs in one PID namespace with its /proc: the innermost pid is the pid.
    assert found.ns_pid == child.pid
    assert found.command == Path(f"/proc/{child.pid}/comm").read_text().strip()
    stat = Path(f"/proc/{child.pid}/stat").read_text()
    assert found.start_time == int(stat.rsplit(")", 1)[1].split()[19])
    assert procs.start_time(PROC, child.pid) == found.start_time


def test_a_name_with_spaces_and_parentheses_does_not_shift_the_start_time(tmp_path: Path) -> None:
    (tmp_path / "7").mkdir()
    fields = ["S", *[str(n) for n in range(4, 22)], "123456", "0"]
    (tmp_path / "7" / "stat").write_text(f"7 (a) b (c) {' '.join(fields)}\n")
    assert procs.start_time(tmp_path, 7) == 123456


def test_a_process_that_exited_has_no_identity(child: subprocess.Popen[bytes]) -> None:
    child.kill()
    child.wait(timeout=10)
    assert procs.identity(PROC, child.pid) is None


def test_kill_stops_the_process_only_when_it_is_still_the_one_judged(child: subprocess.Popen[bytes]) -> None:
    asked: list[int] = []

    def not_it() -> bool:
        asked.append(child.pid)
        return False

    assert procs.kill(child.pid, not_it) is False
    assert asked == [child.pid]
    assert child.poll() is None
    assert procs.kill(child.pid, lambda: True) is True
    assert child.wait(timeout=10) == -signal.SIGKILL


def test_kill_of_a_process_that_is_gone_signals_nothing(child: subprocess.Popen[bytes]) -> None:
    child.kill()
    child.wait(timeout=10)
    with pytest.raises(ProcessLookupError):
        os.kill(child.pid, 0)
    assert procs.kill(child.pid, lambda: True) is False
