"""The daemon's own health for probes: /healthz (alive and serving) and /readyz (registered, published).

Liveness answers only if our DRA socket answers a real gRPC call — a process that runs but whose
socket was removed or whose server is wedged is restarted; readiness also waits for the kubelet to
have accepted the registration and for the slice to be in the API. tessera/serving.py serves them.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import grpc

from tessera.proto.dra.v1 import api_pb2 as v1
from tessera.proto.dra.v1 import api_pb2_grpc as v1_grpc
from tessera.serving import Endpoints


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


def endpoints(alive: Callable[[], bool], not_ready: Callable[[], str | None]) -> Endpoints:
    """/healthz from ``alive``; /readyz from ``not_ready``, which returns None when ready, else what
    is missing."""

    def readyz() -> tuple[bool, str]:
        missing = not_ready()
        return missing is None, missing or "ok"

    return Endpoints(healthz=lambda: (alive(), "the DRA socket does not answer"), readyz=readyz)
