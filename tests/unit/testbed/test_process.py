"""ManagedProcess keeps each daemon's output in its log, fails fast when the daemon dies, and stops
it for sure — SIGTERM first, SIGKILL for one that ignores it."""

from __future__ import annotations

import logging
import signal
import socket
import sys
from pathlib import Path

import pytest

from testbed.polling import Fatal
from testbed.process import ManagedProcess, free_port


def test_output_goes_to_the_log_file(tmp_path: Path) -> None:
    child = "import time; print('hello from the child', flush=True); time.sleep(60)"
    process = ManagedProcess("greeter", [sys.executable, "-c", child], tmp_path)
    process.wait_until(lambda: "hello" in process.log_path.read_text(), 60, "output")
    process.stop()
    assert "hello from the child" in process.log_tail()


def test_waiting_fails_fast_with_the_log_when_the_process_exits(tmp_path: Path) -> None:
    """A wait for a process that has exited stops at its next look, with the exit status and the
    log, instead of polling until its timeout. Shown without timing it: the wait is given an hour,
    so only failing fast lets the test end (pytest's timeout would fail it otherwise), and once
    the process has exited the wait must not even ask the readiness check again."""
    process = ManagedProcess(
        "crasher", [sys.executable, "-c", "import sys; print('bad flag'); sys.exit(3)"], tmp_path
    )
    asked: list[bool] = []

    def ready() -> bool:
        asked.append(process.running())
        return False

    with pytest.raises(Fatal, match=r"crasher exited with status 3 before health(.|\n)*bad flag"):
        process.wait_until(ready, 3600, "health")
    assert all(asked)  # every look at readiness was made while the process still ran
    looks = len(asked)
    with pytest.raises(Fatal, match="crasher exited with status 3 before health again"):
        process.wait_until(ready, 3600, "health again")
    assert len(asked) == looks  # and a wait begun after it exited made none
    process.stop()


def test_stop_kills_a_process_that_ignores_sigterm(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """A process that ignores SIGTERM is killed with SIGKILL once the grace period is over, not
    waited for: it dies of SIGKILL (had stop() waited, its 60 s sleep would have ended it with
    status 0, or pytest's timeout the test), and stop() says that it killed it."""
    stubborn = (
        "import signal, time\n"
        "signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
        "print('ignoring', flush=True)\n"
        "time.sleep(60)\n"
    )
    process = ManagedProcess("stubborn", [sys.executable, "-c", stubborn], tmp_path)
    process.wait_until(lambda: "ignoring" in process.log_path.read_text(), 60, "signal handler")
    with caplog.at_level(logging.WARNING, logger="testbed.process"):
        process.stop(grace=0.5)
    assert not process.running()
    assert process._popen.returncode == -signal.SIGKILL
    assert "stubborn ignored SIGTERM for 0s; killing it" in caplog.text


def test_stop_is_idempotent(tmp_path: Path) -> None:
    process = ManagedProcess("sleeper", [sys.executable, "-c", "import time; time.sleep(60)"], tmp_path)
    process.stop()
    process.stop()
    assert not process.running()


def test_free_port_is_bindable() -> None:
    port = free_port()
    with socket.socket() as s:
        s.bind(("127.0.0.1", port))


def test_free_port_is_outside_the_range_the_kernel_gives_outgoing_connections() -> None:
    """A server port taken from the ephemeral range can meet an outgoing connection's local port;
    free_port keeps out of it (this machine's range leaves room below it, as Linux's default does),
    and out of the NodePort range, where the chart's exporter listens (31995)."""
    low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    if low - 10000 < 1000:
        pytest.skip(f"this machine's ephemeral range starts at {low}: no room below it")
    ports = {free_port() for _ in range(50)}
    assert all(10000 <= port < min(low, 30000) for port in ports)


def test_free_port_skips_a_port_another_socket_holds(monkeypatch: pytest.MonkeyPatch) -> None:
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        held: int = holder.getsockname()[1]
        others = range(held + 1, held + 50)
        candidates = iter([held, held, *others])  # the held port comes up first, twice
        monkeypatch.setattr("testbed.process.random.choice", lambda _: next(candidates))
        monkeypatch.setattr("testbed.process._ephemeral_low", lambda: held + 50)
        monkeypatch.setattr("testbed.process._LISTEN_PORTS", range(held - 1000, held + 1000))
        assert free_port() in others
