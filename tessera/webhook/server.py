"""HTTPS transport: routes, limits, authentication, decoding, timing; the decision itself is
``admission.admit``.

``/mutate`` takes AdmissionReview v1 posts; ``/healthz`` answers while the process serves;
``/readyz`` only once the slice cache has its first list; ``/metrics`` is Prometheus text. The same
routes, except ``/mutate``, are served in plain HTTP on the metrics port for scrapers, and the two
probes alone on a probe port of their own (so that no scraper, and nobody holding the metrics port's
connections, stands between the kubelet and its probes), by tessera/serving.py as every Tessera
process serves them; the HTTPS port answers them through the same ``serving.Endpoints``, and a
mounted certificate is loaded by ``serving.TlsFiles``.

The admission port is the one listener Tessera does not take from tessera/serving.py. It is the
cluster's security boundary, and its bounds need what a thread per connection cannot give: thousands
of slow or idle connections held for a coroutine each, a deadline on a whole request rather than on
each read, a refusal (403, 411/413/431) before a body is read, and a fixed pool deciding reviews
while probes are answered at once. Nor does aiohttp give them, measured against it (docs/webhook.md, "Why
the admission listener is hand-written").

Everything that reaches the port is treated as hostile until the API server's client certificate
says otherwise, so every resource a caller can hold is bounded:

- with client authentication on, the TLS handshake requires a certificate the client CA verifies:
  a client without one gets no further than a failed handshake, within ``REQUEST_TIMEOUT``;
- connections are read by one event loop, never a thread each: a connection waiting for its next
  request costs a coroutine. One whose certificate names an allowed client (the API server) is
  counted apart, up to ``MAX_VERIFIED``; every other (still in its handshake, or any connection
  where authentication is off) takes a slot of ``MAX_UNVERIFIED``, at most ``MAX_PER_PEER`` from one
  address, a newcomer taking the oldest slot of the address holding the most when all are taken
  (tessera/peer_slots.py), and may sit idle only ``UNVERIFIED_IDLE_TIMEOUT``: whatever others
  open, the API server's connections are never refused;
- once a request's first byte arrives, its head and body must follow within ``REQUEST_TIMEOUT``
  (and the TLS handshake within the same), else 408 and the connection is closed: slow clients
  cannot hold anything for long, nor delay the reviews of others;
- a head is at most ``MAX_HEAD`` bytes (431); a body must say its ``Content-Length`` (411, or 400
  when it is not a number) of at most ``MAX_BODY`` bytes (413, answered without reading it);
- reviews are decided by a pool of ``WORKERS`` threads, so a flood queues instead of starting
  threads without end;
- a malformed review gets 400 and one sentence (review.check_request), never the 500 kept for the
  webhook's own faults.

Connections are kept alive (the apiserver reuses them) and time out when idle, so a shutdown waits
only for reviews in flight; before it, :meth:`WebhookServer.drain` lets clients move away. Answers
go out in one write with TCP_NODELAY, so Nagle's algorithm never holds them for the client's
delayed ACK.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import socket
import ssl
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from http import HTTPStatus
from typing import Any, Protocol

from kubernetes.client import ApiException
from urllib3.exceptions import HTTPError as ConnectionFailure

from tessera.gpu_request import Refusal
from tessera.peer_slots import PeerSlots
from tessera.quantity import KiB, MiB
from tessera.serving import Endpoints, HttpServer, registry_metrics
from tessera.webhook import review
from tessera.webhook.admission import DEFAULT_POLICY, AdmissionPolicy, admit
from tessera.webhook.authentication import ClientPolicy
from tessera.webhook.fleet import Fleet
from tessera.webhook.metrics import WebhookMetrics
from tessera.webhook.tls import Certificates

log = logging.getLogger(__name__)

IDLE_TIMEOUT = 180.0
"""Seconds a kept-alive connection of the API server may sit idle before the server closes it. Longer than the
apiserver's own idle timeout (Go's 90 s), so the apiserver always closes first: a server closing an
idle connection races the client's next POST on it, which the client reports as a broken pipe and
does not retry. On shutdown, idle connections are closed at once, after the drain (WebhookServer.drain)
has let clients move to other replicas."""

REQUEST_TIMEOUT = 0.8
"""Seconds from a request's first byte (or a connection's opening, for the TLS handshake) until all
of it has arrived. The API server writes a review in one go (a pod is at most ~1.5 MB), which takes
milliseconds; a client slower than this is holding the connection, not sending a review."""

CLOSE_TIMEOUT = 0.25
"""Seconds a closing connection may take for the client's TLS close_notify before it is reset: a
client that answers does so in milliseconds, one still uploading a refused body never does."""

MAX_BODY = 3 * MiB
"""Largest review body read. etcd stores objects of at most 1.5 MiB (its default request limit), so
a pod under review is smaller than that; the review wraps it with the request's few fields, and a
mutating webhook may see a pod other webhooks enlarged. Twice the object bound leaves room for both."""

MAX_HEAD = 16 * KiB
"""Largest request line and headers, together. The API server's are a few hundred bytes."""

WORKERS = 8
"""Threads that decide reviews. A decision is milliseconds of CPU plus, for a new template shape, one
API call; eight keep a replica's core busy while a template write waits on the API server."""

MAX_VERIFIED = 1024
"""Connections whose certificate names an allowed client, at most; one more is closed after its
handshake. Only the API server can open these, and it keeps a few per replica."""

MAX_UNVERIFIED = 1024
"""Every other connection at once: those still in their TLS handshake and, where authentication is
off, every connection. Past it a newcomer takes the oldest slot of the address holding the most."""

MAX_PER_PEER = 256
"""Unverified connections from one address. Where authentication is off the API server is one of
them: it keeps 25 idle connections per replica and opens one per concurrent call past those
(docs/webhook.md, "Pod bursts"), well under this; four addresses are needed to take every slot."""

BACKLOG = 4096
"""Connections the kernel queues until the event loop accepts them (capped by net.core.somaxconn,
4096 by default). Slots are shared out after the accept: a queue that overflows drops the API
server's connection with everyone else's, to wait out TCP's retransmits (1 s, then 3 s), and a
tenant reopening a thousand connections at once would overflow the former 256."""

UNVERIFIED_IDLE_TIMEOUT = 30.0
"""Seconds an unverified connection (authentication off) may sit idle: whoever holds one may be
anyone. Shorter than the API server's own 90 s, so the server may close one of the API server's idle
connections first; docs/webhook.md ("Bounded input") says what that costs."""


class Templates(Protocol):
    def ensure(self, template: dict[str, Any]) -> bool: ...


class WebhookApp:
    """Everything a request needs, apart from sockets: the fleet, the template store, the
    administrator's policy, metrics."""

    def __init__(
        self,
        fleet: Callable[[], Fleet],
        templates: Templates,
        ready: Callable[[], bool] = lambda: True,
        policy: AdmissionPolicy = DEFAULT_POLICY,
    ) -> None:
        self.fleet = fleet
        self.templates = templates
        self.ready = ready
        self.policy = policy
        self.metrics = WebhookMetrics()
        self.draining = threading.Event()
        """Set on SIGTERM, before ``closing``: not ready, still serving, each answer closes its connection."""
        self.closing = threading.Event()
        self.last_request = float("-inf")
        """When the latest request began (time.monotonic()): what the drain waits to see go quiet."""
        self.endpoints = Endpoints(
            healthz=lambda: (True, "ok"),
            readyz=lambda: (
                self.ready() and not self.draining.is_set() and not self.closing.is_set(),
                "slice cache not synced, or shutting down",
            ),
            metrics=registry_metrics(self.metrics.registry),
        )

    def review(self, body: bytes) -> tuple[int, bytes]:
        """HTTP status and body for one posted review."""
        started = time.perf_counter()
        outcome = "error"
        try:
            try:
                request = review.parse_review(body)
            except review.BadReview as error:
                outcome = "malformed"
                return 400, str(error).encode()
            try:
                decision = admit(request, self.fleet(), self.policy)
                if decision.templates and not request.get("dryRun"):
                    for template in decision.templates:
                        if self.templates.ensure(template):
                            self.metrics.templates_created.inc()
                response, outcome = decision.response, decision.outcome
            except Refusal as refusal:  # a template of that name exists and Tessera did not write it
                response, outcome = review.deny(request["uid"], str(refusal)), "denied"
            except ApiException as error:
                message = f"could not create the pod's ResourceClaimTemplate: {error.status} {error.reason}."
                response = review.deny(request["uid"], message, code=500)
            except ConnectionFailure as error:  # the store already sent a lost create twice
                log.warning("review %s: no answer from the API server: %s", request["uid"], error)
                message = (
                    "could not create the pod's ResourceClaimTemplate: the API server did not answer"
                    f" ({type(error).__name__}); create the pod again."
                )
                response = review.deny(request["uid"], message, code=500)
            except Exception:
                log.exception("review %s failed", request["uid"])
                response = review.deny(request["uid"], "internal error in the Tessera webhook.", code=500)
            return 200, json.dumps(response, separators=(",", ":")).encode()
        finally:
            self.metrics.reviews.labels(outcome).inc()
            self.metrics.latency.observe(time.perf_counter() - started)
            self.metrics.gpu_sizes.set(len(self.fleet().memory_sizes))


class HttpError(Exception):
    """A request refused before it reaches the app: the status and one sentence; the connection is
    closed after the answer."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


@dataclass
class _Request:
    method: str
    path: str
    version: str
    headers: dict[str, str]
    """Lower-cased names; a repeated header keeps its first value, except Content-Length (checked)."""

    @property
    def keep_alive(self) -> bool:
        connection = self.headers.get("connection", "").lower()
        return "close" not in connection and (self.version == "HTTP/1.1" or "keep-alive" in connection)


def _parse_head(head: bytes) -> _Request:
    lines = head.decode("latin-1").split("\r\n")
    parts = lines[0].split(" ")
    if len(parts) != 3 or not parts[2].startswith("HTTP/1."):
        raise HttpError(400, "the request line is not HTTP/1.x.")
    headers: dict[str, str] = {}
    for line in lines[1:]:
        if not line:
            continue
        name, colon, value = line.partition(":")
        if not colon or not name or name != name.strip():
            raise HttpError(400, "a request header is malformed.")
        name, value = name.lower(), value.strip()
        if name == "content-length" and headers.get(name, value) != value:
            raise HttpError(400, "the request has two different Content-Length headers.")
        headers.setdefault(name, value)
    return _Request(parts[0], parts[1].split("?", 1)[0], parts[2], headers)


def _content_length(request: _Request) -> int:
    """The body's length, refused past MAX_BODY before a byte of it is read."""
    if "transfer-encoding" in request.headers:
        raise HttpError(411, "a chunked body is not accepted; send Content-Length.")
    raw = request.headers.get("content-length")
    if raw is None:
        if request.method == "POST":
            raise HttpError(411, "the request has no Content-Length.")
        return 0
    if not raw.isdigit() or len(raw) > 12:
        raise HttpError(400, "the request's Content-Length is not a number.")
    length = int(raw)
    if length > MAX_BODY:
        raise HttpError(413, f"the request body is larger than {MAX_BODY // MiB} MiB.")
    return length


def _answer(status: int, body: bytes, content_type: str, close: bool) -> bytes:
    head = [
        f"HTTP/1.1 {status} {HTTPStatus(status).phrase}",
        f"Content-Type: {content_type}",
        f"Content-Length: {len(body)}",
    ]
    if close:
        head.append("Connection: close")
    return ("\r\n".join(head) + "\r\n\r\n").encode("latin-1") + body


async def _close(writer: asyncio.StreamWriter) -> None:
    """Close a connection, within CLOSE_TIMEOUT. A TLS close waits for the client's close_notify,
    by default for 30 s: a client still uploading a body the server refused from its head (a 10 MB
    review without a certificate) held the connection that long. Past the bound it is aborted."""
    writer.close()
    try:
        await asyncio.wait_for(writer.wait_closed(), CLOSE_TIMEOUT)
    except (TimeoutError, OSError, ssl.SSLError):
        writer.transport.abort()


class _Listener:
    """The admission port's connections on the event loop: HTTPS with /mutate, probes and metrics."""

    def __init__(self, server: WebhookServer) -> None:
        self.server = server
        self.app = server.app

    async def connection(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        server = self.server
        task = asyncio.current_task()
        assert task is not None
        self.app.metrics.connections.inc()
        peer = str(writer.get_extra_info("peername")[0])
        taken = server.unverified.take(peer, task)
        if not taken.admitted or self.app.closing.is_set():
            server.unverified.release(peer, task)
            writer.transport.abort()
            return
        if taken.evicted is not None:  # its handshake or read ends at once, and it closes up
            taken.evicted.cancel()
        server.connections.add(task)
        try:
            sock = writer.get_extra_info("socket")
            if sock is not None:
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)  # answers go out at once
            # The context current right now, so a rotated certificate serves new connections.
            await writer.start_tls(server.certificates.context(), ssl_handshake_timeout=REQUEST_TIMEOUT)
            idle_timeout = UNVERIFIED_IDLE_TIMEOUT
            if self._allowed(writer):  # the API server: out of everyone else's reach
                server.unverified.release(peer, task)
                if len(server.verified) >= MAX_VERIFIED:
                    return
                server.verified.add(task)
                idle_timeout = IDLE_TIMEOUT
            while not self.app.closing.is_set():
                server.idle[task] = writer
                try:
                    first = await asyncio.wait_for(reader.readexactly(1), idle_timeout)
                finally:
                    server.idle.pop(task, None)
                if not await self._one_request(first, reader, writer):
                    return
        except (OSError, EOFError, ssl.SSLError, TimeoutError, asyncio.IncompleteReadError):
            log.debug("connection %s ended", writer.get_extra_info("peername"), exc_info=True)
        finally:
            try:
                await _close(writer)
            finally:  # even when the close is cancelled (a slot given up to a newcomer)
                server.unverified.release(peer, task)
                server.verified.discard(task)
                server.connections.discard(task)

    def _allowed(self, writer: asyncio.StreamWriter) -> bool:
        """Whether the handshake verified a certificate of an allowed client."""
        policy = self.server.clients
        return policy is not None and policy.refusal(writer.get_extra_info("peercert")) is None

    async def _one_request(
        self, first: bytes, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> bool:
        """Read, answer; whether the connection stays open for another request."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + REQUEST_TIMEOUT
        self.app.last_request = time.monotonic()

        def left() -> float:
            # wait_for, unlike asyncio.timeout, returns a read that completed in the same loop turn
            # as its deadline: a replica paused past the deadline (CPU throttling) still answers a
            # request that had arrived in time. The floor lets a read of buffered bytes run at all.
            return max(deadline - loop.time(), 0.01)

        try:
            try:
                head = first + await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), left())
            except asyncio.LimitOverrunError:
                message = f"the request's head is larger than {MAX_HEAD // KiB} KiB."
                raise HttpError(431, message) from None
            request = _parse_head(head)
            self._authenticate(request, writer)
            body = await asyncio.wait_for(reader.readexactly(_content_length(request)), left())
        except TimeoutError:
            sentence = "the request did not arrive in time."
            await self._send(writer, 408, sentence.encode(), "text/plain", close=True)
            return False
        except HttpError as error:
            await self._send(writer, error.status, str(error).encode(), "text/plain", close=True)
            return False
        if request.method == "POST":  # a review: decided in the pool
            status, answer, content_type = await loop.run_in_executor(
                self.server.workers, self._route, request, body
            )
        else:  # probes and metrics: answered here, so a busy pool never fails a liveness probe
            status, answer, content_type = self._route(request, body)
        close = not request.keep_alive or self.app.draining.is_set() or self.app.closing.is_set()
        await self._send(writer, status, answer, content_type, close)
        return not close

    def _authenticate(self, request: _Request, writer: asyncio.StreamWriter) -> None:
        """Refuse a review from anyone but the API server, before its body is read."""
        policy = self.server.clients
        if policy is None or request.method != "POST" or request.path != "/mutate":
            return
        refusal = policy.refusal(writer.get_extra_info("peercert"))
        if refusal is not None:
            raise HttpError(*refusal)

    def _route(self, request: _Request, body: bytes) -> tuple[int, bytes, str]:
        """Status, body and content type for one complete request (a review in a worker thread)."""
        app, endpoints = self.app, self.app.endpoints
        if request.method != "POST" or request.path != "/mutate":
            served = endpoints.answer(request.path) if request.method == "GET" else endpoints.not_found()
            return served.status, served.body, served.content_type
        content_type = request.headers.get("content-type", "").split(";", 1)[0].strip()
        if content_type != "application/json":
            return 415, b"expected application/json", "text/plain"
        status, answer = app.review(body)
        return status, answer, "application/json" if status == 200 else "text/plain"

    async def _send(
        self, writer: asyncio.StreamWriter, status: int, body: bytes, content_type: str, close: bool
    ) -> None:
        if 400 <= status < 500 and status != 404:
            self.app.metrics.refused.labels(str(status)).inc()
        writer.write(_answer(status, body, content_type, close))
        await asyncio.wait_for(writer.drain(), IDLE_TIMEOUT)


class WebhookServer:
    """The HTTPS server on an event loop in a thread of its own, reviews decided in a bounded pool of
    worker threads; and optionally the plain port for probes and metrics (tessera/serving.py)."""

    def __init__(
        self,
        app: WebhookApp,
        certificates: Certificates,
        host: str = "0.0.0.0",
        port: int = 8443,
        metrics_port: int | None = None,
        clients: ClientPolicy | None = None,
        probe_port: int | None = None,
    ) -> None:
        """clients: who may post reviews (the TLS context requires and verifies their certificates);
        None serves any caller, for a cluster whose API server presents no certificate.
        metrics_port, probe_port: plain HTTP for /metrics (and the probes), and for the probes alone;
        None leaves one off."""
        self.app = app
        self.certificates = certificates
        self.clients = clients
        self.workers = ThreadPoolExecutor(WORKERS, thread_name_prefix="webhook-review")
        self.connections: set[asyncio.Task[Any]] = set()
        self.unverified: PeerSlots[asyncio.Task[Any]] = PeerSlots(MAX_UNVERIFIED, MAX_PER_PEER)
        """Connections not known to be the API server's; one given up is cancelled."""
        self.verified: set[asyncio.Task[Any]] = set()
        """Connections whose certificate names an allowed client."""
        self.idle: dict[asyncio.Task[Any], asyncio.StreamWriter] = {}
        """Connections waiting for their next request: what shutdown may close at once."""
        self._loop = asyncio.new_event_loop()
        self._thread: threading.Thread | None = None
        self._server = self._loop.run_until_complete(
            asyncio.start_server(
                _Listener(self).connection, host, port, limit=MAX_HEAD, reuse_address=True, backlog=BACKLOG
            )
        )
        self._plain = (
            None
            if metrics_port is None
            else HttpServer("probes and metrics", host, metrics_port, app.endpoints)
        )
        self._probes = (
            None if probe_port is None else HttpServer("probes", host, probe_port, app.endpoints.probes())
        )

    @property
    def port(self) -> int:
        return int(self._server.sockets[0].getsockname()[1])

    @property
    def metrics_port(self) -> int | None:
        """The plain port's bound port, once started (None when it is off)."""
        return self._plain.port if self._plain is not None else None

    @property
    def probe_port(self) -> int | None:
        """The probe port's bound port, once started (None when it is off)."""
        return self._probes.port if self._probes is not None else None

    def start(self) -> None:
        for plain in (self._plain, self._probes):
            if plain is not None:
                plain.start()
        self._thread = threading.Thread(target=self._loop.run_forever, name="webhook-http", daemon=True)
        self._thread.start()

    def drain(self, seconds: float, quiet: float = 0.0, longest: float = 0.0) -> float | None:
        """Keep serving while clients move away: /readyz fails, so the pod leaves its Service's
        endpoints, and every answer says ``Connection: close``, so a client that still comes here
        ends that connection itself, after its answer, and opens the next one elsewhere. The drain
        lasts ``seconds``, and then on until no request has come for ``quiet`` seconds, but no
        longer than ``longest`` in all. Returns the seconds from the drain's start to the last
        request it saw (None: none came), which is how long the API server kept calling.

        Why: closing a kept-alive connection races the API server's next POST on it, which it
        reports as EOF and does not retry, refusing a pod (failurePolicy Fail). Stopping accepting
        before the API server sees the endpoint go refuses its next connection: on a loaded
        machine that took longer than a fixed 5 s (issue 37), so the drain waits for the calls to
        stop rather than for a guess."""
        started = time.monotonic()
        self.app.draining.set()
        log.info(
            "draining for %g s, then until no request for %g s (at most %g s in all): "
            "not ready, closing each connection after its answer",
            seconds,
            quiet,
            max(seconds, longest),
        )
        end = started + seconds
        while not self.app.closing.wait(max(end - time.monotonic(), 0.0)):  # a stop ends the drain
            end = min(max(self.app.last_request + quiet, end), started + max(seconds, longest))
            if time.monotonic() >= end:
                break
        last = self.app.last_request - started
        if last < 0:
            log.info("drained after %.1f s: no request came while draining", time.monotonic() - started)
            return None
        log.info("drained after %.1f s: the last request came %.1f s in", time.monotonic() - started, last)
        return last

    def stop(self) -> None:
        """Stop accepting, finish the reviews in flight, close kept-alive connections, return."""
        self.app.closing.set()
        if self._thread is None:  # never started
            self._loop.run_until_complete(self._shutdown())
        else:
            asyncio.run_coroutine_threadsafe(self._shutdown(), self._loop).result()
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join()
        self._loop.close()
        self.workers.shutdown(wait=True)
        for plain in (self._plain, self._probes):  # last: /readyz says "closing" meanwhile
            if plain is not None:
                plain.stop()

    async def _shutdown(self) -> None:
        self._server.close()
        for writer in list(self.idle.values()):  # waiting for a request that will not be served
            writer.transport.abort()  # its read ends at once; its task closes up and returns
        pending = list(self.connections)
        if pending:
            await asyncio.wait(pending)
        with contextlib.suppress(Exception):
            await self._server.wait_closed()
