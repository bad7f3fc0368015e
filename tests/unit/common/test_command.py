"""Every command's skeleton: a signal stops the service cleanly (exit 0), a failure to start or
a fatal fault stops it too and exits 1, and stop() runs whatever happened."""

from __future__ import annotations

import argparse
import logging
import os
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from tessera import command
from tessera.command import run_until_signalled
from tessera.kube import CONNECT_TIMEOUT, READ_TIMEOUT, WATCH_IDLE_TIMEOUT, BoundedApiClient


class Recorder:
    """A service that records what it was asked to do; ``wait`` signals the process itself."""

    def __init__(self, start_error: Exception | None = None, fatal: str | None = None) -> None:
        self.fatal: str | None = None
        self.calls: list[str] = []
        self._start_error = start_error
        self._fatal = fatal
        self._stopped = threading.Event()

    def start(self) -> None:
        self.calls.append("start")
        if self._start_error is not None:
            raise self._start_error

    def wait(self) -> None:
        self.calls.append("wait")
        if self._fatal is not None:
            self.fatal = self._fatal
            return
        os.kill(os.getpid(), signal.SIGTERM)
        assert self._stopped.wait(5)

    def request_stop(self) -> None:
        self.calls.append("request_stop")
        self._stopped.set()

    def stop(self) -> None:
        self.calls.append("stop")


@pytest.fixture(autouse=True)
def _restore_handlers() -> Iterator[None]:
    saved = signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGINT)
    yield
    signal.signal(signal.SIGTERM, saved[0])
    signal.signal(signal.SIGINT, saved[1])


def test_sigterm_requests_a_stop_and_exits_0(caplog: pytest.LogCaptureFixture) -> None:
    service = Recorder()
    with caplog.at_level(logging.INFO):
        assert run_until_signalled(service, logging.getLogger("t")) == 0
    assert service.calls == ["start", "wait", "request_stop", "stop"]
    assert "received SIGTERM; shutting down" in caplog.text


def test_a_start_that_raises_is_stopped_and_exits_1_with_why(caplog: pytest.LogCaptureFixture) -> None:
    service = Recorder(start_error=OSError("no NVML"))
    assert run_until_signalled(service, logging.getLogger("t")) == 1
    assert service.calls == ["start", "stop"]
    assert service.fatal == "no NVML"
    assert "stopped because no NVML" in caplog.text


def test_a_fatal_fault_is_stopped_and_exits_1_with_why(caplog: pytest.LogCaptureFixture) -> None:
    service = Recorder(fatal="pod watch: gone")
    assert run_until_signalled(service, logging.getLogger("t")) == 1
    assert service.calls == ["start", "wait", "stop"]
    assert "stopped because pod watch: gone" in caplog.text


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="tessera-test")
    command.log_flags(parser, "TESSERA_TEST_")
    return parser


def test_flags_that_make_no_sense_exit_2_with_one_line_and_nothing_started(
    capsys: pytest.CaptureFixture[str],
) -> None:
    def refuse(args: argparse.Namespace) -> command.Service:
        raise command.UsageError("the node name is required")

    assert command.main(_parser(), refuse, logging.getLogger("t"), []) == 2
    assert capsys.readouterr().err == "tessera-test: the node name is required\n"


def test_main_configures_logging_from_the_environment_and_runs_the_service(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("TESSERA_TEST_LOG_LEVEL", "warning")
    made: list[argparse.Namespace] = []

    def service(args: argparse.Namespace) -> command.Service:
        made.append(args)
        return Recorder(fatal="gone")

    ended: list[int] = []
    assert command.main(_parser(), service, logging.getLogger("t"), [], end=ended.append) == 1
    assert ended == [1], "the process is ended with the service's status"
    assert made[0].log_level == "warning" and logging.getLogger().level == logging.WARNING
    assert "[env TESSERA_TEST_LOG_FORMAT]" in _parser().format_help()


LOGGING_TO_THE_END = """
import argparse, logging, os, signal, threading, sys
from tessera import command

class Chatty(command.Stoppable):
    fatal = None

    def start(self):
        for n in range(4):  # as watches and a status write left hanging in an outage keep logging
            threading.Thread(target=self.chat, daemon=True).start()
        os.kill(os.getpid(), signal.SIGTERM)

    def chat(self):
        while True:
            logging.getLogger("loop").warning("still waiting for the API server " + "x" * 200)

    def stop(self):
        logging.getLogger("t").info("stopped")

p = argparse.ArgumentParser()
command.log_flags(p, "T_")
sys.exit(command.main(p, lambda args: Chatty(), logging.getLogger("t"), []))
"""


def test_a_stop_while_daemon_threads_keep_logging_ends_with_the_status_and_everything_logged(
    tmp_path: Path,
) -> None:
    """The process ends through end_process while loops in daemon threads still run and log, as
    watches and writes left hanging by an unanswering API server do: exit status 0 and the service's
    last line flushed. (Under load, the interpreter's own shutdown around such threads aborted a
    cleanly stopped daemon, SIGABRT after its "stopped" line; tests/integration/test_driver_outages.py
    caught it in a four-worker run. Ending past that shutdown is what this checks is safe.)"""
    script = tmp_path / "chatty.py"
    script.write_text(LOGGING_TO_THE_END)
    for _ in range(3):
        done = subprocess.run(
            [sys.executable, str(script)], capture_output=True, text=True, timeout=60, check=False
        )
        assert done.returncode == 0, done.stderr[-2000:]
        assert "stopped" in done.stderr


KUBECONFIG = """apiVersion: v1
kind: Config
clusters: [{name: c, cluster: {server: "https://127.0.0.1:1"}}]
users: [{name: u, user: {token: t}}]
contexts: [{name: x, context: {cluster: c, user: u}}]
current-context: x
"""


def test_the_api_bounds_come_from_the_flags_or_the_environment_else_the_defaults(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every daemon's client waits --api-timeout for an answer and --api-watch-idle-timeout for a
    watch's next byte; the outage tests run the daemons with shorter bounds through these."""
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(KUBECONFIG)

    def client_of(argv: list[str]) -> BoundedApiClient:
        p = argparse.ArgumentParser(prog="t")
        command.api_flags(p, "TESSERA_TEST_")
        return command.api_client_from(p.parse_args(argv), kubeconfig)

    defaults = client_of([])
    assert (defaults.timeout, defaults.watch_idle_timeout) == (
        (CONNECT_TIMEOUT, READ_TIMEOUT),
        WATCH_IDLE_TIMEOUT,
    )
    monkeypatch.setenv("TESSERA_TEST_API_WATCH_IDLE_TIMEOUT", "20")
    configured = client_of(["--api-timeout=7"])
    assert (configured.timeout, configured.watch_idle_timeout) == ((CONNECT_TIMEOUT, 7.0), 20.0)
