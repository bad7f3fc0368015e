"""``/metrics`` on port 31995 (``--metrics-port``): start and stop.

A threaded WSGI server from the standard library: each scrape runs the collectors on its own
thread, so a slow scrape never holds up the DRA socket. It answers in the Prometheus text format
(tessera/exporter/exposition.py says why not OpenMetrics), gzip-compressed when the scraper accepts it, as
Prometheus does by default. Bound to ``--metrics-address`` (all addresses by default, so Prometheus in
the cluster can reach every node; a node address or loopback where that is too wide).
"""

from __future__ import annotations

import gzip
import logging
import socket
import threading
from collections.abc import Callable, Iterable
from socketserver import ThreadingMixIn
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

from prometheus_client.registry import Collector

from tessera.exporter import exposition

log = logging.getLogger(__name__)


class _ThreadingServer(ThreadingMixIn, WSGIServer):
    daemon_threads = True  # a scrape in progress must not hold up the daemon's exit


class _IPv6ThreadingServer(_ThreadingServer):
    address_family = socket.AF_INET6


class _QuietHandler(WSGIRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:
        """Every scrape would be a line of the daemon's log: say nothing (errors still raise)."""


_StartResponse = Callable[[str, list[tuple[str, str]]], Any]


def metrics_app(registry: Collector) -> Callable[[dict[str, Any], _StartResponse], Iterable[bytes]]:
    """The WSGI application: ``/metrics`` renders ``registry``; any other path is 404."""

    def app(environ: dict[str, Any], start_response: _StartResponse) -> Iterable[bytes]:
        if environ.get("PATH_INFO") != "/metrics":
            start_response("404 Not Found", [("Content-Type", "text/plain")])
            return [b"not found: metrics are at /metrics\n"]
        body = exposition.render(registry)
        headers = [("Content-Type", exposition.CONTENT_TYPE)]
        if "gzip" in environ.get("HTTP_ACCEPT_ENCODING", ""):
            body = gzip.compress(body)
            headers.append(("Content-Encoding", "gzip"))
        start_response("200 OK", headers)
        return [body]

    return app


class MetricsServer:
    def __init__(self, address: str, port: int, registry: Collector) -> None:
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
        server_class = _IPv6ThreadingServer if ":" in self._address else _ThreadingServer
        self._server = make_server(
            self._address,
            self._port,
            metrics_app(self._registry),
            server_class=server_class,
            handler_class=_QuietHandler,
        )
        self._thread = threading.Thread(target=self._server.serve_forever, name="metrics", daemon=True)
        self._thread.start()
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
