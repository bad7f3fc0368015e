"""Run a long-lived service until SIGTERM or SIGINT: the one lifecycle of Tessera's node processes.

``tessera-driver`` and ``tessera-exporter`` both start a service, wait until a signal or a failed
background loop stops it, always stop it, and exit 1 with the reason when it stopped on a fault;
writing that once keeps their signal handling and exit statuses the same.
"""

from __future__ import annotations

import logging
import signal
from types import FrameType
from typing import Protocol


class Service(Protocol):
    """What ``run_until_signalled`` drives: ``fatal`` is set (to why) when the service failed."""

    fatal: str | None

    def start(self) -> None: ...

    def wait(self) -> None: ...

    def request_stop(self) -> None: ...

    def stop(self) -> None: ...


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
