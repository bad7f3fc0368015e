"""ManagedProcess keeps each daemon's output in its log, fails fast when the daemon dies, and stops
it for sure — SIGTERM first, SIGKILL for one that ignores it."""

from __future__ import annotations

import socket
import sys
import time
from pathlib import Path

import pytest

from tessera.testbed.polling import Fatal
from tessera.testbed.process import ManagedProcess, free_port


def test_output_goes_to_the_log_file(tmp_path: Path) -> None:
    child = "import time; print('hello from the child', flush=True); time.sleep(60)"
    process = ManagedProcess("greeter", [sys.executable, "-c", child], tmp_path)
    process.wait_until(lambda: "hello" in process.log_path.read_text(), 10, "output")
    process.stop()
    assert "hello from the child" in process.log_tail()


def test_waiting_fails_fast_with_the_log_when_the_process_exits(tmp_path: Path) -> None:
    process = ManagedProcess(
        "crasher", [sys.executable, "-c", "import sys; print('bad flag'); sys.exit(3)"], tmp_path
    )
    started = time.monotonic()
    with pytest.raises(Fatal, match=r"crasher exited with status 3 before health(.|\n)*bad flag"):
        process.wait_until(lambda: False, 30, "health")
    assert time.monotonic() - started < 10
    process.stop()


def test_stop_kills_a_process_that_ignores_sigterm(tmp_path: Path) -> None:
    stubborn = (
        "import signal, time\n"
        "signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
        "print('ignoring', flush=True)\n"
        "time.sleep(60)\n"
    )
    process = ManagedProcess("stubborn", [sys.executable, "-c", stubborn], tmp_path)
    process.wait_until(lambda: "ignoring" in process.log_path.read_text(), 10, "signal handler")
    started = time.monotonic()
    process.stop(grace=0.5)
    assert not process.running()
    assert time.monotonic() - started < 5


def test_stop_is_idempotent(tmp_path: Path) -> None:
    process = ManagedProcess("sleeper", [sys.executable, "-c", "import time; time.sleep(60)"], tmp_path)
    process.stop()
    process.stop()
    assert not process.running()


def test_free_port_is_bindable() -> None:
    port = free_port()
    with socket.socket() as s:
        s.bind(("127.0.0.1", port))
