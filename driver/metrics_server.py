"""``/metrics`` on port 31995 (``--metrics-port``): start and stop.

prometheus_client's own threaded WSGI server: it negotiates the text and OpenMetrics formats and
gzip with the scraper, and each scrape runs the collectors on its own thread, so a slow scrape never
holds up the DRA socket. Bound to ``--metrics-address`` (all addresses by default, so Prometheus in
the cluster can reach every node; a node address or loopback where that is too wide).
"""

from __future__ import annotations

import logging
import threading
from wsgiref.simple_server import WSGIServer

from prometheus_client import CollectorRegistry, start_http_server

log = logging.getLogger(__name__)


class MetricsServer:
    def __init__(self, address: str, port: int, registry: CollectorRegistry) -> None:
        self._address = address
        self._port = port
        self._registry = registry
        self._server: WSGIServer | None = None
        self._thread: threading.Thread | None = None

    @property
    def port(self) -> int:
        """The bound port (the real one when 0 asked for any free port)."""
        return self._server.server_port if self._server is not None else self._port

    def start(self) -> None:
        self._server, self._thread = start_http_server(self._port, self._address, self._registry)
        log.info("serving metrics on http://%s:%d/metrics", self._address, self.port)

    def stop(self) -> None:
        """Stop answering and close the socket. Safe to call twice."""
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None
        if self._thread is not None:
            self._thread.join(timeout=5)
            self._thread = None
