"""The kubelet's side of the DRA plugin protocol, for tests and benchmarks without a kubelet.

Integration tests run the driver next to kubelet-less Node objects; the scheduler still allocates
claims for pods bound there, and this client makes the calls the kubelet would make for them, on
the same sockets and with the same messages, so prepare can be exercised (and timed) directly.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import grpc

from tessera.proto.dra.v1 import api_pb2 as dra
from tessera.proto.dra.v1 import api_pb2_grpc as dra_grpc
from tessera.proto.registration.v1 import api_pb2 as registration
from tessera.proto.registration.v1 import api_pb2_grpc as registration_grpc

ClaimRef = tuple[str, str, str]
"""(namespace, name, uid), as the kubelet sends a claim."""

KUBELET_CALL_TIMEOUT = 45.0
"""The kubelet's per-call timeout for DRA plugins (defaultClientCallTimeout)."""


class KubeletClient:
    def __init__(self, dra_socket: Path) -> None:
        self._channel = grpc.insecure_channel(f"unix:{dra_socket}")
        self._stub: Any = dra_grpc.DRAPluginStub(self._channel)

    def close(self) -> None:
        self._channel.close()

    def prepare(self, claims: Sequence[ClaimRef]) -> Any:
        request = dra.NodePrepareResourcesRequest(
            claims=[dra.Claim(namespace=ns, name=name, uid=uid) for ns, name, uid in claims]
        )
        return self._stub.NodePrepareResources(request, timeout=KUBELET_CALL_TIMEOUT)

    def unprepare(self, claims: Sequence[ClaimRef]) -> Any:
        request = dra.NodeUnprepareResourcesRequest(
            claims=[dra.Claim(namespace=ns, name=name, uid=uid) for ns, name, uid in claims]
        )
        return self._stub.NodeUnprepareResources(request, timeout=KUBELET_CALL_TIMEOUT)


def plugin_info(registration_socket: Path) -> Any:
    """GetInfo, as the kubelet's plugin watcher asks it (with its 1 s timeout)."""
    with grpc.insecure_channel(f"unix:{registration_socket}") as channel:
        stub: Any = registration_grpc.RegistrationStub(channel)
        return stub.GetInfo(registration.InfoRequest(), timeout=1.0)
