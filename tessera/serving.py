"""The one way Tessera serves HTTP: health probes, Prometheus metrics, optionally over reloadable TLS.

Every Tessera process answers the same few GET paths - ``/healthz`` (alive), ``/readyz`` (ready for
work) and ``/metrics`` (Prometheus text) - on a port of its own. :class:`Endpoints` decides what each
path answers, and :class:`HttpServer` serves them from threads, so a slow scrape never holds up a
probe or the process's own work. The webhook's admission listener, which is not a thread server
(tessera/webhook/server.py says why), answers the same paths through the same :class:`Endpoints`.

The thread server is bounded, as anything reachable from the cluster must be: at most
``MAX_CONNECTIONS`` connections are served at once, at most ``MAX_PER_PEER`` of them from one address,
and when all are taken a newcomer takes the oldest slot of the address holding the most
(tessera/peer_slots.py), so clients holding connections cannot starve a probe or a scraper. A
connection has ``REQUEST_TIMEOUT`` seconds from its accept for everything (the TLS handshake, the
request, the answer) before it is closed: the deadline is one per request, not one per read, so a
client sending a header line now and then holds its slot no longer than one that sends nothing.
Each connection carries one request.

With :class:`TlsFiles` the server speaks TLS with a certificate and key read from files, reloaded
when their bytes change (a mounted secret that cert-manager rotates): every new connection uses the
context current when it was accepted.
"""

from __future__ import annotations

import contextlib
import gzip
import hashlib
import io
import logging
import socket
import ssl
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from prometheus_client.registry import Collector

from tessera.peer_slots import PeerSlots

log = logging.getLogger(__name__)

MAX_CONNECTIONS = 64
"""Connections served at once. Probes and scrapers hold one or two each; more is someone else."""

MAX_PER_PEER = 8
"""Connections served at once from one address: a kubelet probing two paths and a scraper fit many
times over; a client opening more is refused, and cannot take more than this from the others."""

REQUEST_TIMEOUT = 10.0
"""Seconds from a connection's accept until its answer has been sent (the TLS handshake, the request
and the answer together). A probe or a scrape sends its request at once; the kubelet's probe timeout
is one second by default."""

_STOP_POLL = 0.1
"""Seconds between the accept loop's looks at a stop request: how long :meth:`HttpServer.stop` may
wait for it (socketserver's default, 0.5 s, was half a second added to every shutdown and rollout)."""

TEXT = "text/plain; charset=utf-8"

Check = Callable[[], tuple[bool, str]]
"""A health check: whether all is well and, when not, one sentence that says why."""


@dataclass(frozen=True)
class Metrics:
    """How ``/metrics`` is rendered: the exposition's bytes, and the content type they are in."""

    render: Callable[[], bytes]
    content_type: str


def registry_metrics(registry: Collector) -> Metrics:
    """``/metrics`` as prometheus_client writes ``registry`` (the exporter plugs its own renderer)."""
    return Metrics(lambda: generate_latest(registry), CONTENT_TYPE_LATEST)


@dataclass(frozen=True)
class Answer:
    status: int
    body: bytes
    content_type: str = TEXT
    encoding: str | None = None
    """``gzip`` when the body is compressed."""


@dataclass(frozen=True)
class Endpoints:
    """What a Tessera process answers on GET; a path left None is not served (404)."""

    healthz: Check | None = None
    readyz: Check | None = None
    metrics: Metrics | None = None

    @property
    def paths(self) -> list[str]:
        served = {"/healthz": self.healthz, "/readyz": self.readyz, "/metrics": self.metrics}
        return [path for path, what in served.items() if what is not None]

    def probes(self) -> Endpoints:
        """The health checks alone, for a probe port of their own."""
        return Endpoints(healthz=self.healthz, readyz=self.readyz)

    def answer(self, path: str, accept_encoding: str = "") -> Answer:
        """200 or 503 with ``ok`` or why not for a check, 200 and the exposition for ``/metrics``
        (gzip-compressed when the client accepts it, as Prometheus does by default), else 404."""
        check = {"/healthz": self.healthz, "/readyz": self.readyz}.get(path)
        if check is not None:
            ok, reason = check()
            return Answer(200, b"ok\n") if ok else Answer(503, f"{reason}\n".encode())
        if path == "/metrics" and self.metrics is not None:
            body = self.metrics.render()
            if "gzip" in accept_encoding:
                return Answer(200, gzip.compress(body), self.metrics.content_type, "gzip")
            return Answer(200, body, self.metrics.content_type)
        return self.not_found()

    def not_found(self) -> Answer:
        return Answer(404, f"not found: this port answers GET {', '.join(self.paths)}\n".encode())


def read_client_ca(path: Path | None) -> bytes | None:
    """The client CA bundle at ``path`` (None without one); raises ValueError with a sentence when it
    holds no certificate, so a bad mount stops a server at start rather than admitting anyone."""
    if path is None:
        return None
    try:
        pem = path.read_bytes()
    except OSError as error:
        raise ValueError(f"cannot read the client CA bundle {path}: {error.strerror}.") from None
    if b"-----BEGIN CERTIFICATE-----" not in pem:
        raise ValueError(f"the client CA bundle {path} holds no PEM certificate.")
    return pem


def server_context(cert_pem: bytes, key_pem: bytes, client_ca: bytes | None = None) -> ssl.SSLContext:
    """A TLS 1.2+ server context for the certificate; with ``client_ca``, every client must present a
    certificate that bundle verifies, or its handshake fails. Required, not optional: a client
    without one that got past the handshake could hold the server's connections (issue 37)."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    # load_cert_chain reads files only: write both to a private folder and remove it at once.
    with tempfile.TemporaryDirectory(prefix="tessera-tls-") as folder:
        cert_file, key_file = Path(folder) / "tls.crt", Path(folder) / "tls.key"
        cert_file.write_bytes(cert_pem)
        key_file.touch(mode=0o600)
        key_file.write_bytes(key_pem)
        context.load_cert_chain(cert_file, key_file)
    if client_ca is not None:
        context.load_verify_locations(cadata=client_ca.decode("ascii", errors="replace"))
        context.verify_mode = ssl.CERT_REQUIRED
    return context


class TlsFiles:
    """A certificate and key from files (a mounted secret: ``tls.crt`` and ``tls.key`` of ``folder``),
    and the client CA bundle when one is given, reloaded by :meth:`refresh` when their bytes change."""

    def __init__(self, folder: Path, client_ca: Path | None = None) -> None:
        self.folder = folder
        self.client_ca = client_ca
        self._digest = b""
        self._context: ssl.SSLContext | None = None
        if not self.refresh():
            raise RuntimeError(f"no certificate in {folder}")

    def _read(self) -> tuple[bytes, bytes, bytes | None]:
        cert, key = (self.folder / "tls.crt").read_bytes(), (self.folder / "tls.key").read_bytes()
        return cert, key, read_client_ca(self.client_ca)

    def refresh(self) -> bool:
        """Pick up new files if there are any; True when the context changed."""
        try:
            cert, key, client_ca = self._read()
        except (OSError, ValueError) as error:
            log.warning("cannot read the certificate in %s: %s", self.folder, error)
            return False
        digest = hashlib.sha256(cert + b"\0" + key + b"\0" + (client_ca or b"")).digest()
        if digest == self._digest:
            return False
        try:
            context = server_context(cert, key, client_ca)
        except (ssl.SSLError, OSError) as error:  # half-written by the kubelet's atomic swap: next time
            log.warning("certificate in %s not usable yet: %s", self.folder, error)
            return False
        self._context, self._digest = context, digest
        log.info("serving the certificate from %s", self.folder)
        return True

    def context(self) -> ssl.SSLContext:
        assert self._context is not None
        return self._context


class _DeadlineSocket(io.RawIOBase):
    """A connection's reads and writes, each allowed only the time left until one deadline: a client
    cannot stretch its request by sending it a little at a time."""

    def __init__(self, connection: socket.socket, deadline: float) -> None:
        super().__init__()
        self._connection = connection
        self._deadline = deadline

    def readable(self) -> bool:
        return True

    def writable(self) -> bool:
        return True

    def arm(self) -> None:
        """Give the next socket operation what is left of the deadline, or raise TimeoutError."""
        left = self._deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError("the connection's deadline has passed")
        self._connection.settimeout(left)

    def readinto(self, buffer: Any) -> int:
        self.arm()
        return self._connection.recv_into(buffer)

    def write(self, data: Any) -> int:
        self.arm()
        self._connection.sendall(data)
        return len(data)


class _Handler(BaseHTTPRequestHandler):
    server: _Server

    def setup(self) -> None:
        """Reads and writes bounded by the deadline set at accept, the TLS handshake included."""
        self.connection = self.request
        bounded = _DeadlineSocket(self.connection, self.server.deadline_of(self.request))
        if isinstance(self.connection, ssl.SSLSocket):
            bounded.arm()
            self.connection.do_handshake()  # here, in the connection's thread, within its deadline
        self.rfile = io.BufferedReader(bounded)
        self.wfile = io.BufferedWriter(bounded)  # the answer goes out in one send, flushed at finish

    def do_GET(self) -> None:
        path = self.path.split("?", 1)[0]
        self._send(self.server.endpoints.answer(path, self.headers.get("Accept-Encoding", "")))

    def _not_found(self) -> None:
        """Nothing here takes a body: every other method is answered as a path not served."""
        self.close_connection = True  # its body, if any, is not read
        self._send(self.server.endpoints.not_found())

    do_POST = do_PUT = do_PATCH = do_DELETE = _not_found

    def _send(self, answer: Answer) -> None:
        self.send_response(answer.status)
        self.send_header("Content-Type", answer.content_type)
        if answer.encoding is not None:
            self.send_header("Content-Encoding", answer.encoding)
        self.send_header("Content-Length", str(len(answer.body)))
        self.end_headers()
        self.wfile.write(answer.body)

    def log_message(self, format: str, *args: Any) -> None:
        """Every probe and scrape would be a line of the process's log: debug only."""
        log.debug("%s: " + format, self.server.name, *args)


def _interrupt(connection: socket.socket) -> None:
    """End a connection another thread is serving: its blocked read or write fails at once and the
    thread closes up. The plain socket's shutdown, so an SSLSocket's state is left to its thread."""
    with contextlib.suppress(OSError):  # already closed by its thread
        socket.socket.shutdown(connection, socket.SHUT_RDWR)


class _Server(ThreadingHTTPServer):
    daemon_threads = True  # a request in progress must not hold up the process's exit
    block_on_close = False
    request_queue_size = 1024
    """The listen backlog (socketserver's default is 5): slots are shared out after the accept, so a
    full queue would drop a probe's connection with the crowd's, to wait out TCP's retransmits."""

    def __init__(self, name: str, address: str, port: int, endpoints: Endpoints, tls: TlsFiles | None):
        self.address_family = socket.AF_INET6 if ":" in address else socket.AF_INET
        self.name = name
        self.endpoints = endpoints
        self.tls = tls
        self._slots: PeerSlots[socket.socket] = PeerSlots(MAX_CONNECTIONS, MAX_PER_PEER)
        self._deadlines: dict[socket.socket, float] = {}
        """Each accepted connection's deadline, until its thread takes it."""
        super().__init__((address, port), _Handler)

    def get_request(self) -> tuple[Any, Any]:
        connection, peer = super().get_request()
        if self.tls is not None:  # the context current now, so a reloaded certificate serves new clients
            connection = self.tls.context().wrap_socket(
                connection, server_side=True, do_handshake_on_connect=False
            )
        self._deadlines[connection] = time.monotonic() + REQUEST_TIMEOUT
        return connection, peer

    def deadline_of(self, connection: socket.socket) -> float:
        return self._deadlines.pop(connection)

    def process_request(self, request: Any, client_address: Any) -> None:
        taken = self._slots.take(client_address[0], request)
        if not taken.admitted:  # its address holds its share already: closed at once
            self._deadlines.pop(request, None)
            self.shutdown_request(request)
            return
        if taken.evicted is not None:
            _interrupt(taken.evicted)
        try:
            super().process_request(request, client_address)
        except BaseException:
            self._deadlines.pop(request, None)
            self._slots.release(client_address[0], request)
            raise

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        try:
            super().process_request_thread(request, client_address)
        finally:
            self._slots.release(client_address[0], request)

    def handle_error(self, request: Any, client_address: Any) -> None:
        """A client that stalls, drops or fails its handshake is its own problem: debug only."""
        log.debug("%s: connection from %s failed", self.name, client_address, exc_info=True)


class HttpServer:
    """:class:`Endpoints` on ``address``:``port`` (0: any free port), from threads; binds on
    :meth:`start`, so a port in use fails the start; :meth:`stop` is safe to call twice."""

    def __init__(
        self, name: str, address: str, port: int, endpoints: Endpoints, tls: TlsFiles | None = None
    ) -> None:
        self.name = name
        self._address = address
        self._port = port
        self._endpoints = endpoints
        self._tls = tls
        self._server: _Server | None = None
        self._thread: threading.Thread | None = None

    @property
    def port(self) -> int:
        """The bound port (the real one when 0 asked for any free port)."""
        return int(self._server.server_address[1]) if self._server is not None else self._port

    def start(self) -> None:
        self._server = _Server(self.name, self._address, self._port, self._endpoints, self._tls)
        self._thread = threading.Thread(
            target=self._server.serve_forever, args=(_STOP_POLL,), name=self.name, daemon=True
        )
        self._thread.start()
        scheme = "https" if self._tls is not None else "http"
        paths = ", ".join(self._endpoints.paths)
        log.info("serving %s on %s://%s:%d (%s)", self.name, scheme, self._address, self.port, paths)

    def stop(self) -> None:
        """Stop accepting and close the socket; requests in flight finish on their own threads."""
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None
        if self._thread is not None:
            self._thread.join(timeout=5)
            self._thread = None
