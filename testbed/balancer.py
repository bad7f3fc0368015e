"""A loopback TCP balancer: what a Service is to the API server, for webhook processes on 127.0.0.1.

The test bed's API server reaches a webhook by URL, which names one address; a chart's webhook is
reached through a Service, which spreads connections over its ready pods and stops sending to a pod
that is gone. :class:`Balancer` does that much for real: each connection it accepts goes to the next
backend in turn, and a backend that refuses the connection (its process is dead) is skipped for the
next one. Bytes are copied both ways untouched, so TLS is between the API server and the webhook.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import socket
import threading
from collections.abc import Sequence

log = logging.getLogger(__name__)

CONNECT_TIMEOUT = 1.0


class Balancer:
    """Listens on 127.0.0.1 (``port``, chosen at start) and forwards to ``backends`` (ports)."""

    def __init__(self, backends: Sequence[int]) -> None:
        self.backends = list(backends)
        self._turn = itertools.count()
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port: int = self._listener.getsockname()[1]
        self._stopped = threading.Event()
        self._thread = threading.Thread(target=self._accept, name="balancer", daemon=True)
        self.forwarded = {port: 0 for port in self.backends}
        """Connections forwarded to each backend, for tests that want both used."""

    def start(self) -> Balancer:
        self._thread.start()
        return self

    def _accept(self) -> None:
        while not self._stopped.is_set():
            try:
                incoming, _ = self._listener.accept()
            except OSError:
                return
            threading.Thread(target=self._forward, args=(incoming,), daemon=True).start()

    def _connect(self) -> socket.socket | None:
        """The next backend that takes the connection, trying each once."""
        start = next(self._turn)
        for offset in range(len(self.backends)):
            port = self.backends[(start + offset) % len(self.backends)]
            try:
                outgoing = socket.create_connection(("127.0.0.1", port), timeout=CONNECT_TIMEOUT)
            except OSError:
                continue
            outgoing.settimeout(None)
            self.forwarded[port] += 1
            return outgoing
        return None

    def _forward(self, incoming: socket.socket) -> None:
        outgoing = self._connect()
        if outgoing is None:
            incoming.close()
            return
        copier = threading.Thread(target=_copy, args=(outgoing, incoming), daemon=True)
        copier.start()
        _copy(incoming, outgoing)
        copier.join()
        incoming.close()
        outgoing.close()

    def stop(self) -> None:
        self._stopped.set()
        self._listener.close()


def _copy(source: socket.socket, target: socket.socket) -> None:
    """Copy until ``source`` ends, then end ``target``'s writing side (a half close, as TCP does)."""
    with contextlib.suppress(OSError):
        while data := source.recv(65536):
            target.sendall(data)
    with contextlib.suppress(OSError):
        target.shutdown(socket.SHUT_WR)
