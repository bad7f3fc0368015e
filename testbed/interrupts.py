"""Turning SIGTERM into KeyboardInterrupt, so every way of stopping the test bed unwinds the same.

Python's default SIGTERM ends the process at once: no finally block, no context-manager exit, no
pytest fixture teardown — and the daemons of a cluster, their temp folders and a node's bridges and
mounts would be left behind. A CI job being cancelled or a user running `kill` should clean up
exactly as Ctrl-C does.
"""

from __future__ import annotations

import signal
from types import FrameType


def _interrupt(signum: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt(f"received signal {signal.Signals(signum).name}")


def interrupt_on_sigterm() -> None:
    """From now on, SIGTERM raises KeyboardInterrupt in the main thread, as SIGINT does."""
    signal.signal(signal.SIGTERM, _interrupt)
