"""The one process skeleton of every Tessera command: flags, logging, run until a signal, exit status.

``tessera-driver``, ``tessera-exporter``, ``tessera-webhook`` and ``tessera-admission-check`` each
parse their flags (every one with an environment-variable default, tessera/settings.py), configure
logging, start a :class:`Service`, wait until SIGTERM, SIGINT or a failure of the service stops it,
always stop it, and exit with one status. Writing that once keeps their logging flags, signal
handling and exit statuses the same: 0 after a signal, 1 (logged with why) when the service could
not start or failed, 2 (one line on stderr) when the flags make no sense.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import signal
import sys
import threading
from collections.abc import Callable, Sequence
from pathlib import Path
from types import FrameType
from typing import NoReturn, Protocol

from tessera import logs
from tessera.kube import CONNECT_TIMEOUT, READ_TIMEOUT, WATCH_IDLE_TIMEOUT, BoundedApiClient, api_client
from tessera.settings import seconds, setting


class Service(Protocol):
    """What a command runs: ``fatal`` is set (to why) when the service failed."""

    fatal: str | None

    def start(self) -> None: ...

    def wait(self) -> None: ...

    def request_stop(self) -> None: ...

    def stop(self) -> None: ...


class Stoppable:
    """The stop event every command's service keeps, and the two Service methods that only touch it:
    ``wait`` returns once a signal (``request_stop``) or the service itself (a failed background
    loop) has set it. Subclasses call ``super().__init__()`` and implement ``start`` and ``stop``."""

    def __init__(self) -> None:
        self._stop = threading.Event()

    def wait(self) -> None:
        self._stop.wait()

    def request_stop(self) -> None:
        self._stop.set()


class UsageError(Exception):
    """Flags that parse but make no sense together: the command exits 2 with this sentence."""


def log_flags(parser: argparse.ArgumentParser, env_prefix: str) -> None:
    """``--log-level`` and ``--log-format``, read from ``<env_prefix>LOG_LEVEL`` and ``..._FORMAT``."""
    levels = ("debug", "info", "warning", "error")
    setting(parser, "--log-level", env_prefix + "LOG_LEVEL", "info", "", choices=levels)
    setting(parser, "--log-format", env_prefix + "LOG_FORMAT", "text", "", choices=("text", "json"))


def api_flags(parser: argparse.ArgumentParser, env_prefix: str) -> None:
    """``--api-timeout`` and ``--api-watch-idle-timeout``, read from ``<env_prefix>API_TIMEOUT`` and
    ``..._WATCH_IDLE_TIMEOUT``: how long the daemon waits on the API server before it takes a call
    for failed or a watch for dead. The defaults suit production; shorter bounds notice an outage
    (a black-holed route) sooner, at the cost of failing calls a slow server would have answered."""
    setting(
        parser,
        "--api-timeout",
        env_prefix + "API_TIMEOUT",
        READ_TIMEOUT,
        "seconds an API call may wait for the answer before it fails and is retried",
        seconds,
    )
    setting(
        parser,
        "--api-watch-idle-timeout",
        env_prefix + "API_WATCH_IDLE_TIMEOUT",
        WATCH_IDLE_TIMEOUT,
        "seconds a watch may go without a byte from the API server before it is dropped and the "
        "list taken again (the server is asked to end each watch within half of this)",
        seconds,
    )


def api_client_from(args: argparse.Namespace, kubeconfig: Path | None) -> BoundedApiClient:
    """The client of ``kubeconfig`` (or $KUBECONFIG, or the service account) with the bounds of
    :func:`api_flags`."""
    return api_client(
        kubeconfig,
        timeout=(CONNECT_TIMEOUT, args.api_timeout),
        watch_idle_timeout=args.api_watch_idle_timeout,
    )


def run_until_signalled(service: Service, log: logging.Logger) -> int:
    """Start ``service``, wait until SIGTERM, SIGINT or its own failure, stop it whatever happened;
    the exit status: 0, or 1 (logged with why) if starting raised or ``fatal`` was set."""

    def on_signal(signum: int, frame: FrameType | None) -> None:
        log.info("received %s; shutting down", signal.Signals(signum).name)
        service.request_stop()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    try:
        service.start()
        service.wait()
    except Exception as error:
        log.exception("cannot run: %s", error)
        service.fatal = str(error)
    finally:
        service.stop()
    if service.fatal:
        log.error("stopped because %s", service.fatal)
        return 1
    return 0


def end_process(status: int) -> NoReturn:
    """Exit with ``status`` now, skipping the interpreter's shutdown.

    Why: a stopped service may leave loops in daemon threads (a watch or a write the API server
    never answers: bounded by their own timeouts, not stopped), still inside an SSL read or a log
    write. The interpreter's shutdown and the C libraries' exit handlers then run around them, and
    under load a daemon stopped cleanly during an API outage aborted there (SIGABRT, after its
    "stopped" line), which the kubelet counts as a crash. Everything logged so far is flushed
    first; nothing else is left to do by then."""
    logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    os._exit(status)


def main(
    parser: argparse.ArgumentParser,
    service: Callable[[argparse.Namespace], Service],
    log: logging.Logger,
    argv: Sequence[str] | None = None,
    *,
    end: Callable[[int], object] = end_process,
) -> int:
    """Parse ``argv`` (the process's arguments when None), configure logging, make the service from
    the flags, run it until a signal, and ``end`` the process with its exit status
    (:func:`end_process`; a test passes its own). Flags that make no sense return 2 before
    anything has started."""
    args = parser.parse_args(argv)
    logs.configure(args.log_level, args.log_format)
    try:
        running = service(args)
    except UsageError as error:
        print(f"{parser.prog}: {error}", file=sys.stderr)
        return 2
    status = run_until_signalled(running, log)
    end(status)
    return status
