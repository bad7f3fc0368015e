"""The DRA node service answers every claim of a call on its own: one claim that cannot be
unprepared, for whatever reason, gets its own error and its neighbours are unprepared."""

from __future__ import annotations

from pathlib import Path

from kubernetes import client

from tessera.driver.claims import ClaimCache
from tessera.driver.config import DriverConfig
from tessera.driver.plugin import DraService
from tessera.names import DRIVER_NAME
from tessera.proto.dra.v1 import api_pb2 as v1
from tests.unit.driver.driver_samples import claim
from tests.unit.driver.test_state import A, node_result, state


def test_one_claim_that_cannot_be_unprepared_fails_alone(tmp_path: Path) -> None:
    config = DriverConfig(node_name="node-a", cdi_dir=tmp_path / "cdi", state_dir=tmp_path / "state")
    devices = state(config)
    for uid in ("uid-1", "uid-2"):
        devices.prepare(claim(node_result(A, "1Gi", "10", f"share-{uid}"), uid=uid, name=uid))
    service = DraService(devices, ClaimCache(client.ResourceV1Api(client.ApiClient()), DRIVER_NAME, "node-a"))
    try:
        request = v1.NodeUnprepareResourcesRequest(
            claims=[
                v1.Claim(namespace="ns", name="uid-1", uid="uid-1"),
                v1.Claim(namespace="ns", name="broken", uid="bad\0uid"),  # no path can hold it
                v1.Claim(namespace="ns", name="uid-2", uid="uid-2"),
            ]
        )
        response = service.unprepare(request, v1)
    finally:
        service.close()

    assert response.claims["uid-1"].error == ""
    assert response.claims["uid-2"].error == ""
    assert response.claims["bad\0uid"].error.startswith("unexpected error unpreparing the claim: ")
    assert devices.records() == {}
    assert not (config.claims_dir / "uid-1").exists() and not (config.claims_dir / "uid-2").exists()
