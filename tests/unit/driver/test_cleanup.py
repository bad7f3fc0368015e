"""The clean-up sweep asks the API only about claims the node's claim watch does not hold: a sweep of
live claims makes no call, and a claim the watch has lost is read once and unprepared if gone."""

from __future__ import annotations

from typing import Any

from kubernetes.client import ApiException

from tessera.driver import cleanup
from tessera.driver.claims import ClaimCache
from tessera.driver.config import DriverConfig
from tessera.names import DRIVER_NAME
from tests.unit.driver.driver_samples import claim
from tests.unit.driver.test_state import A, config, node_result, state

__all__ = ["config"]  # the fixture, used by name


class ClaimsApi:
    """``read_namespaced_resource_claim`` of an API server that has none of the claims it is asked
    for; it counts the reads."""

    def __init__(self) -> None:
        self.reads: list[str] = []

    def read_namespaced_resource_claim(self, name: str, namespace: str, **_: Any) -> Any:
        self.reads.append(f"{namespace}/{name}")
        raise ApiException(status=404, reason="Not Found")


def test_a_sweep_reads_only_the_claims_the_watch_does_not_hold(config: DriverConfig) -> None:
    alive = claim(node_result(A, "1Gi", "10", "s1"), uid="uid-alive", name="alive")
    gone = claim(node_result(A, "1Gi", "10", "s2"), uid="uid-gone", name="gone")
    devices = state(config)
    devices.prepare(alive)
    devices.prepare(gone)
    api = ClaimsApi()
    claims = ClaimCache(api, DRIVER_NAME, "node-a")  # type: ignore[arg-type]
    claims.on_event("SYNCED", {"items": [alive]})  # the watch's list holds the live claim only

    assert cleanup.sweep(config, devices, claims) == 1

    assert api.reads == ["ns/gone"]
    assert set(devices.records()) == {"uid-alive"}

    api.reads.clear()
    assert cleanup.sweep(config, devices, claims) == 0
    assert api.reads == []
