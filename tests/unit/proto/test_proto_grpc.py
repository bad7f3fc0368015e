"""The generated stubs work over a Unix socket the way the kubelet uses them.

A real grpcio server on a socket in tmp_path, with trivial servicers, answers real clients built from
the same stubs: the DRA v1 prepare call (with share_id presence), plugin registration, and the
server-streaming health watch. The servicers are plain classes (the add_*_to_server functions only
look their methods up), so the code type-checks although the stubs are untyped.
"""

from __future__ import annotations

from collections.abc import Iterator
from concurrent import futures
from pathlib import Path
from typing import Any

import grpc
import pytest

from tessera.proto.dra.v1 import api_pb2 as dra_v1
from tessera.proto.dra.v1 import api_pb2_grpc as dra_v1_grpc
from tessera.proto.health.v1 import api_pb2 as health_v1
from tessera.proto.health.v1 import api_pb2_grpc as health_v1_grpc
from tessera.proto.registration.v1 import api_pb2 as registration
from tessera.proto.registration.v1 import api_pb2_grpc as registration_grpc

TIMEOUT_S = 10


class Plugin:
    """Prepares every claim with one device; only claims named "shared" get a share ID."""

    def __init__(self, socket: Path) -> None:
        self.socket = socket

    def NodePrepareResources(self, request: Any, context: grpc.ServicerContext) -> Any:
        response = dra_v1.NodePrepareResourcesResponse()
        for claim in request.claims:
            device = response.claims[claim.uid].devices.add(
                pool_name="node-a", device_name="gpu-0", cdi_device_ids=[f"gpu.tessera.dev/gpu={claim.uid}"]
            )
            if claim.name == "shared":
                device.share_id = f"share-{claim.uid}"
        return response

    def NodeUnprepareResources(self, request: Any, context: grpc.ServicerContext) -> Any:
        response = dra_v1.NodeUnprepareResourcesResponse()
        for claim in request.claims:
            response.claims[claim.uid].SetInParent()
        return response

    def GetInfo(self, request: Any, context: grpc.ServicerContext) -> Any:
        return registration.PluginInfo(
            type="DRAPlugin",
            name="gpu.tessera.dev",
            endpoint=str(self.socket),
            supported_versions=["v1.DRAPlugin", "v1.DRAResourceHealth"],
        )

    def NotifyRegistrationStatus(self, request: Any, context: grpc.ServicerContext) -> Any:
        return registration.RegistrationStatusResponse()

    def NodeWatchResources(self, request: Any, context: grpc.ServicerContext) -> Iterator[Any]:
        for status in (health_v1.HEALTHY, health_v1.UNHEALTHY):
            device = health_v1.DeviceHealth(
                device=health_v1.DeviceIdentifier(pool_name="node-a", device_name="gpu-0"),
                health=status,
                last_updated_time=1_700_000_000,
                health_check_timeout_seconds=30,
            )
            yield health_v1.NodeWatchResourcesResponse(devices=[device])


@pytest.fixture
def channel(tmp_path: Path) -> Iterator[grpc.Channel]:
    socket = tmp_path / "dra.sock"
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    plugin = Plugin(socket)
    dra_v1_grpc.add_DRAPluginServicer_to_server(plugin, server)
    registration_grpc.add_RegistrationServicer_to_server(plugin, server)
    health_v1_grpc.add_DRAResourceHealthServicer_to_server(plugin, server)
    server.add_insecure_port(f"unix://{socket}")
    server.start()
    try:
        with grpc.insecure_channel(f"unix://{socket}") as opened:
            yield opened
    finally:
        server.stop(grace=None)


def test_v1_client_prepares_and_sees_share_id_presence(channel: grpc.Channel) -> None:
    stub = dra_v1_grpc.DRAPluginStub(channel)
    request = dra_v1.NodePrepareResourcesRequest(
        claims=[
            dra_v1.Claim(namespace="ns", uid="uid-1", name="shared"),
            dra_v1.Claim(namespace="ns", uid="uid-2", name="whole"),
        ]
    )
    response = stub.NodePrepareResources(request, timeout=TIMEOUT_S)
    assert set(response.claims) == {"uid-1", "uid-2"}
    [shared] = response.claims["uid-1"].devices
    [whole] = response.claims["uid-2"].devices
    assert shared.HasField("share_id")
    assert shared.share_id == "share-uid-1"
    assert list(shared.cdi_device_ids) == ["gpu.tessera.dev/gpu=uid-1"]
    assert not whole.HasField("share_id")
    assert whole.share_id == ""
    unprepared = stub.NodeUnprepareResources(
        dra_v1.NodeUnprepareResourcesRequest(claims=request.claims), timeout=TIMEOUT_S
    )
    assert {uid: reply.error for uid, reply in unprepared.claims.items()} == {"uid-1": "", "uid-2": ""}


def test_share_id_presence_survives_the_wire_even_when_empty() -> None:
    device = dra_v1.Device(share_id="")
    assert device.HasField("share_id")
    decoded = dra_v1.Device.FromString(device.SerializeToString())
    assert decoded.HasField("share_id")
    assert not dra_v1.Device.FromString(dra_v1.Device().SerializeToString()).HasField("share_id")


def test_registration_answers_get_info(channel: grpc.Channel) -> None:
    stub = registration_grpc.RegistrationStub(channel)
    info = stub.GetInfo(registration.InfoRequest(), timeout=TIMEOUT_S)
    assert (info.type, info.name) == ("DRAPlugin", "gpu.tessera.dev")
    assert list(info.supported_versions) == ["v1.DRAPlugin", "v1.DRAResourceHealth"]
    status = registration.RegistrationStatus(plugin_registered=True)
    stub.NotifyRegistrationStatus(status, timeout=TIMEOUT_S)


def test_health_watch_streams_each_complete_list(channel: grpc.Channel) -> None:
    stub = health_v1_grpc.DRAResourceHealthStub(channel)
    responses = list(stub.NodeWatchResources(health_v1.NodeWatchResourcesRequest(), timeout=TIMEOUT_S))
    statuses = [[device.health for device in response.devices] for response in responses]
    assert statuses == [[health_v1.HEALTHY], [health_v1.UNHEALTHY]]
    assert responses[0].devices[0].device.device_name == "gpu-0"
