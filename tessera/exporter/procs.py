"""A host process as the bypass loop needs it: who it is (its pid in its own PID namespace, its
start time, its command name) and how to stop it without ever hitting another process.

Read from /proc/<pid>/status, stat and comm, which the kernel writes and anyone may read. Stopping
goes through a pidfd: ``pidfd_open`` pins the process the pid names at that moment; the caller's
check that it is still the process it judged (same container cgroup, same start time) runs after
that, and the signal goes to the pidfd, never to a number. If the process exited and its pid was
reused in between, the check fails; if it exits after the check, the signal reaches nothing
(ESRCH), never the pid's next owner.
"""

from __future__ import annotations

import os
import signal
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

_MAX_BYTES = 4096
"""More than /proc/<pid>/stat or the NSpid line needs (status is read line by line)."""


@dataclass(frozen=True)
class Identity:
    ns_pid: int | None
    """The pid as the process's own (innermost) PID namespace numbers it: the last NSpid field."""
    start_time: int
    """Field 22 of /proc/<pid>/stat: clock ticks after boot when it started."""
    command: str
    """/proc/<pid>/comm (the kernel's 15-character name), for messages."""


def start_time(proc: Path, pid: int) -> int | None:
    """Field 22 of /proc/<pid>/stat; None if the process is gone. The command name (field 2) may
    hold spaces and parentheses, so fields are counted after its last ')'."""
    try:
        with open(proc / str(pid) / "stat", "rb") as f:
            text = f.read(_MAX_BYTES).decode("ascii", errors="replace")
    except OSError:
        return None
    fields = text[text.rfind(")") + 1 :].split()
    # After the name: field 3 (state) is fields[0], so field 22 is fields[19].
    try:
        return int(fields[19])
    except (IndexError, ValueError):
        return None


def identity(proc: Path, pid: int) -> Identity | None:
    """Who host process ``pid`` is; None if it has exited."""
    started = start_time(proc, pid)
    if started is None:
        return None
    ns_pid: int | None = None
    try:
        with open(proc / str(pid) / "status", encoding="ascii", errors="replace") as f:
            for line in f:
                if line.startswith("NSpid:"):
                    ns_pid = int(line.split()[-1])
                    break
        command = (proc / str(pid) / "comm").read_bytes()[:64].decode(errors="replace").strip()
    except (OSError, ValueError, IndexError):
        return None
    return Identity(ns_pid, started, command)


def kill(pid: int, still_the_one: Callable[[], bool]) -> bool:
    """SIGKILL host process ``pid`` if ``still_the_one()`` - asked after the process is pinned -
    says it is the process judged. False when it is gone or is not that process any more."""
    try:
        pidfd = os.pidfd_open(pid)
    except ProcessLookupError:
        return False
    try:
        if not still_the_one():
            return False
        signal.pidfd_send_signal(pidfd, signal.SIGKILL)
        return True
    except ProcessLookupError:
        return False
    finally:
        os.close(pidfd)
