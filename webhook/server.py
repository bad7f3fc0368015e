"""HTTPS transport: routes, content type, decoding, timing; the decision itself is ``admission.admit``.

``/mutate`` takes AdmissionReview v1 posts; ``/healthz`` answers while the process serves;
``/readyz`` only once the slice cache has its first list; ``/metrics`` is Prometheus text. The same
routes, except ``/mutate``, are served in plain HTTP on the metrics port for probes and scrapers.
Connections are kept alive (the apiserver reuses them) and time out when idle, so a shutdown waits
only for reviews in flight.
"""

from __future__ import annotations

import contextlib
import json
import logging
import socket
import threading
import time
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Protocol

from kubernetes.client import ApiException
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from tessera.webhook import review
from tessera.webhook.admission import admit
from tessera.webhook.fleet import Fleet
from tessera.webhook.metrics import WebhookMetrics
from tessera.webhook.tls import Certificates

log = logging.getLogger(__name__)

IDLE_TIMEOUT = 180.0
"""Seconds a kept-alive connection may sit idle before the server closes it. Longer than the
apiserver's own idle timeout (Go's 90 s), so the apiserver always closes first: a server closing an
idle connection races the client's next POST on it, which the client reports as a broken pipe and
does not retry. On shutdown idle connections are closed at once instead."""


class Templates(Protocol):
    def ensure(self, template: dict[str, Any]) -> bool: ...


class WebhookApp:
    """Everything a request needs, apart from sockets: the fleet, the template store, metrics."""

    def __init__(
        self, fleet: Callable[[], Fleet], templates: Templates, ready: Callable[[], bool] = lambda: True
    ) -> None:
        self.fleet = fleet
        self.templates = templates
        self.ready = ready
        self.metrics = WebhookMetrics()
        self.closing = threading.Event()
        self.idle: set[socket.socket] = set()
        """Connections waiting for their next request: what shutdown may close at once."""
        self.idle_lock = threading.Lock()

    def review(self, body: bytes) -> tuple[int, bytes]:
        """HTTP status and body for one posted review."""
        started = time.perf_counter()
        outcome = "error"
        try:
            try:
                request = review.parse_review(body)
            except review.BadReview as error:
                return 400, str(error).encode()
            try:
                decision = admit(request, self.fleet())
                if decision.templates and not request.get("dryRun"):
                    for template in decision.templates:
                        if self.templates.ensure(template):
                            self.metrics.templates_created.inc()
                response, outcome = decision.response, decision.outcome
            except ApiException as error:
                message = f"could not create the pod's ResourceClaimTemplate: {error.status} {error.reason}."
                response = review.deny(request["uid"], message, code=500)
            except Exception:
                log.exception("review %s failed", request["uid"])
                response = review.deny(request["uid"], "internal error in the Tessera webhook.", code=500)
            return 200, json.dumps(response, separators=(",", ":")).encode()
        finally:
            self.metrics.reviews.labels(outcome).inc()
            self.metrics.latency.observe(time.perf_counter() - started)
            self.metrics.gpu_sizes.set(len(self.fleet().memory_sizes))


def _handler(app: WebhookApp, mutate: bool) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"
        timeout = IDLE_TIMEOUT

        def handle_one_request(self) -> None:
            with app.idle_lock:
                if app.closing.is_set():
                    self.close_connection = True
                    return
                app.idle.add(self.connection)
            try:
                super().handle_one_request()
            finally:
                with app.idle_lock:
                    app.idle.discard(self.connection)

        def parse_request(self) -> bool:
            with app.idle_lock:  # a request line arrived: no longer idle
                app.idle.discard(self.connection)
            return super().parse_request()

        def log_message(self, format: str, *args: Any) -> None:
            log.debug("%s %s", self.address_string(), format % args)

        def _send(self, status: int, body: bytes, content_type: str = "text/plain") -> None:
            self.send_response(status)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(body)))
            if app.closing.is_set():
                self.send_header("Connection", "close")
                self.close_connection = True
            # Headers and body in one write: two small writes let Nagle's algorithm hold the second
            # until the client's delayed ACK (up to 40 ms), which the apiserver's client would wait.
            buffered: list[bytes] = self._headers_buffer  # type: ignore[attr-defined]
            buffered.append(b"\r\n")
            buffered.append(body)
            self.flush_headers()

        def do_GET(self) -> None:
            if self.path == "/healthz":
                self._send(200, b"ok")
            elif self.path == "/readyz":
                ready = app.ready() and not app.closing.is_set()
                self._send(200 if ready else 503, b"ok" if ready else b"slice cache not synced or closing")
            elif self.path == "/metrics":
                self._send(200, generate_latest(app.metrics.registry), CONTENT_TYPE_LATEST)
            else:
                self._send(404, b"not found")

        def do_POST(self) -> None:
            if not mutate or self.path.split("?", 1)[0] != "/mutate":
                self._send(404, b"not found")
                return
            content_type = self.headers.get("Content-Type", "").split(";", 1)[0].strip()
            length = int(self.headers.get("Content-Length") or 0)
            body = self.rfile.read(length)
            if content_type != "application/json":
                self._send(415, b"expected application/json")
                return
            status, answer = app.review(body)
            self._send(status, answer, "application/json" if status == 200 else "text/plain")

    return Handler


class _Server(ThreadingHTTPServer):
    daemon_threads = False
    block_on_close = True
    allow_reuse_address = True

    def handle_error(self, request: Any, client_address: Any) -> None:
        """A client that resets or fails its handshake is its own problem: note it, no traceback."""
        log.debug("connection from %s failed", client_address, exc_info=True)


class WebhookServer:
    """The HTTPS server (and optionally the plain one for probes and metrics), started in threads."""

    def __init__(
        self,
        app: WebhookApp,
        certificates: Certificates,
        host: str = "0.0.0.0",
        port: int = 8443,
        metrics_port: int | None = None,
    ) -> None:
        self.app = app
        certs = certificates

        class TlsServer(_Server):
            def get_request(self) -> tuple[socket.socket, Any]:
                sock, address = super().get_request()
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)  # answers go out at once
                # Handshake in the handler thread (first read), with the context current right now.
                wrapped = certs.context().wrap_socket(sock, server_side=True, do_handshake_on_connect=False)
                return wrapped, address

        self.https = TlsServer((host, port), _handler(app, mutate=True))
        self.plain = (
            _Server((host, metrics_port), _handler(app, mutate=False)) if metrics_port is not None else None
        )
        self._threads: list[threading.Thread] = []

    @property
    def port(self) -> int:
        return int(self.https.server_address[1])

    @property
    def metrics_port(self) -> int | None:
        return int(self.plain.server_address[1]) if self.plain else None

    def start(self) -> None:
        for server in (self.https, self.plain):
            if server is not None:
                thread = threading.Thread(target=server.serve_forever, name="webhook-http", daemon=True)
                thread.start()
                self._threads.append(thread)

    def stop(self) -> None:
        """Stop accepting, finish the reviews in flight, close kept-alive connections, return."""
        with self.app.idle_lock:
            self.app.closing.set()
            for connection in self.app.idle:  # waiting for a request that will not be served
                with contextlib.suppress(OSError):
                    connection.shutdown(socket.SHUT_RDWR)
        for server in (self.https, self.plain):
            if server is not None:
                server.shutdown()
                server.server_close()  # joins the handler threads: in-flight reviews complete
        for thread in self._threads:
            thread.join()
