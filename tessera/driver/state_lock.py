"""One daemon per state directory: an exclusive flock held for the daemon's whole life.

The daemon keeps its claims' checkpoint in memory and rewrites the file from that memory. Two daemons
on one node (a surge rollout, a second release, an operator's copy run by hand) would each rewrite
it from their own view and lose each other's claims. The kernel drops a flock when its holder exits,
however it exits (kill -9 included), so a lock never outlives its daemon and needs no cleanup; a new
daemon that finds the lock held waits for the old one to go, saying so, instead of crash-looping.
"""

from __future__ import annotations

import fcntl
import logging
import os
import threading
from pathlib import Path

log = logging.getLogger(__name__)

LOCK_FILE = "daemon.lock"
"""In the state directory; holds the holder's PID as text, for the log line of the one that waits."""


class StateDirectoryBusy(RuntimeError):
    """Another daemon holds the state directory and did not let go in time."""


class StateLock:
    """The lock on one state directory; :meth:`acquire` once, :meth:`release` (or exit) to let go."""

    def __init__(self, state_dir: Path) -> None:
        self.path = state_dir / LOCK_FILE
        self._fd: int | None = None

    def acquire(self, stop: threading.Event, timeout: float | None = None, poll: float = 1.0) -> bool:
        """Take the lock, waiting while another process holds it: True once taken, False when ``stop``
        is set first (a standby replaced before its turn came is not a failure). Raises
        StateDirectoryBusy when ``timeout`` seconds pass (None: no limit)."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        waited = 0.0
        announced = False
        try:
            while True:
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    break
                except BlockingIOError:
                    if not announced:
                        log.warning(
                            "another tessera-driver (pid %s) holds %s: waiting for it to exit before "
                            "touching the claims' state",
                            _holder(fd),
                            self.path,
                        )
                        announced = True
                    if timeout is not None and waited >= timeout:
                        raise StateDirectoryBusy(
                            f"another tessera-driver (pid {_holder(fd)}) still holds {self.path}; "
                            "only one daemon may use a node's state directory"
                        ) from None
                    if stop.wait(poll):
                        os.close(fd)
                        return False
                    waited += poll
        except BaseException:
            os.close(fd)
            raise
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        self._fd = fd
        if announced:
            log.info("took %s after waiting %.0f s", self.path, waited)
        return True

    def release(self) -> None:
        if self._fd is not None:
            os.close(self._fd)  # closing the last descriptor drops the flock
            self._fd = None


def _holder(fd: int) -> str:
    """The PID the holder wrote, or "unknown" (it may not have written it yet)."""
    try:
        return os.pread(fd, 32, 0).decode(errors="replace").strip() or "unknown"
    except OSError:
        return "unknown"
