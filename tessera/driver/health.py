"""The daemon's own health for probes: /healthz (alive and serving) and /readyz (registered, published).

Liveness answers only if our DRA socket answers a real gRPC call — a process that runs but whose
socket was removed or whose server is wedged is restarted; readiness also waits for the kubelet to
have accepted the registration and for the slice to be in the API.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import grpc

from tessera.proto.dra.v1 import api_pb2 as v1
from tessera.proto.dra.v1 import api_pb2_grpc as v1_grpc

log = logging.getLogger(__name__)


def dra_socket_answers(socket: Path, timeout: float = 2.0) -> bool:
    """Whether an empty NodePrepareResources on ``socket`` returns (as the kubelet would call it)."""
    try:
        with grpc.insecure_channel(f"unix:{socket}") as channel:
            v1_grpc.DRAPluginStub(channel).NodePrepareResources(
                v1.NodePrepareResourcesRequest(), timeout=timeout
            )
        return True
    except grpc.RpcError:
        return False


class HealthServer:
    def __init__(
        self,
        address: str,
        port: int,
        alive: Callable[[], bool],
        ready: Callable[[], str | None],
        dead: str = "the DRA socket does not answer",
    ) -> None:
        """``ready`` returns None when ready, else what is missing; ``dead`` is /healthz's answer
        when ``alive`` is false."""

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                if self.path == "/healthz":
                    ok, text = (True, "ok") if alive() else (False, dead)
                elif self.path == "/readyz":
                    missing = ready()
                    ok, text = (missing is None, missing or "ok")
                else:
                    self.send_error(404)
                    return
                body = (text + "\n").encode()
                self.send_response(200 if ok else 503)
                self.send_header("Content-Type", "text/plain")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args: object) -> None:
                log.debug("health: " + format, *args)

        self._server = ThreadingHTTPServer((address, port), Handler)
        self.port = self._server.server_address[1]
        self._thread = threading.Thread(target=self._server.serve_forever, name="health-http", daemon=True)

    def start(self) -> None:
        self._thread.start()
        log.info("health endpoints on port %d (/healthz, /readyz)", self.port)

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()
