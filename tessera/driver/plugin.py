"""The kubelet's DRA node service: one implementation behind v1 and v1beta1, one answer per claim.

Every claim in a request gets its own result or its own one-sentence error (which the kubelet puts
in the pod's events); one bad claim never fails its neighbours. Claims of one call are prepared in
parallel. The two API versions differ only in their package and v1's ``share_id``, so the same
handler fills either version's messages.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from types import ModuleType
from typing import Any

import grpc

from tessera.driver.allocation import AllocationError
from tessera.driver.checkpoint import PreparedDevice
from tessera.driver.claim_status import ClaimStatusWriter
from tessera.driver.claims import ClaimCache
from tessera.driver.container_driver import DriverSourceError
from tessera.driver.state import DeviceState
from tessera.proto.dra.v1 import api_pb2 as v1
from tessera.proto.dra.v1 import api_pb2_grpc as v1_grpc
from tessera.proto.dra.v1beta1 import api_pb2 as v1beta1
from tessera.proto.dra.v1beta1 import api_pb2_grpc as v1beta1_grpc

log = logging.getLogger(__name__)

SUPPORTED_VERSIONS = ("v1.DRAPlugin", "v1beta1.DRAPlugin")
"""In the order the kubelet should prefer them (some kubelets take the first they know)."""


class DraService:
    """NodePrepareResources and NodeUnprepareResources, whatever the API version."""

    def __init__(
        self,
        state: DeviceState,
        claims: ClaimCache,
        status: ClaimStatusWriter | None = None,
        workers: int = 16,
    ) -> None:
        self._state = state
        self._claims = claims
        self._status = status
        self._pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="prepare")

    def close(self) -> None:
        self._pool.shutdown(wait=True, cancel_futures=True)

    def prepare(self, request: Any, pb: ModuleType) -> Any:
        call = uuid.uuid4().hex[:8]
        began = time.monotonic()
        response = pb.NodePrepareResourcesResponse()
        results = self._pool.map(lambda c: (c, self._prepare_one(c, pb, call)), list(request.claims))
        for claim, result in results:
            response.claims[claim.uid].CopyFrom(result)
        log.debug(
            "call %s: prepared %d claims in %.1f ms",
            call,
            len(request.claims),
            1e3 * (time.monotonic() - began),
        )
        return response

    def _prepare_one(self, claim: Any, pb: ModuleType, call: str) -> Any:
        obj = None
        try:
            obj = self._claims.get(claim.namespace, claim.name, claim.uid)
            devices = self._state.prepare(obj)
        except (AllocationError, DriverSourceError) as error:
            return self._failed(pb, claim, obj, call, str(error))
        except OSError as error:
            return self._failed(pb, claim, obj, call, f"cannot write the claim's files on the node: {error}")
        except Exception as error:  # a bug or the API: still one answer for this claim only
            log.exception("call %s: preparing %s/%s failed unexpectedly", call, claim.namespace, claim.name)
            return self._failed(pb, claim, obj, call, f"unexpected error preparing the claim: {error}")
        if self._status is not None:
            self._status.report(obj, None)
        return pb.NodePrepareResourceResponse(devices=[_device(pb, d) for d in devices])

    def _failed(
        self, pb: ModuleType, claim: Any, obj: Mapping[str, Any] | None, call: str, message: str
    ) -> Any:
        """The claim's error for the kubelet (which shows it in the pod's events), also recorded in
        the claim's status when the claim could be read."""
        if obj is not None and self._status is not None:
            self._status.report(obj, message)
        log.warning(
            "call %s: cannot prepare ResourceClaim %s/%s (%s): %s",
            call,
            claim.namespace,
            claim.name,
            claim.uid,
            message,
        )
        return pb.NodePrepareResourceResponse(error=message)

    def unprepare(self, request: Any, pb: ModuleType) -> Any:
        response = pb.NodeUnprepareResourcesResponse()
        for claim in request.claims:
            response.claims[claim.uid].CopyFrom(self._unprepare_one(claim, pb))
        return response

    def _unprepare_one(self, claim: Any, pb: ModuleType) -> Any:
        """One claim's answer, as for prepare: whatever goes wrong with it, its neighbours in the call
        are unprepared and the kubelet retries only this one."""
        try:
            self._state.unprepare(claim.uid)
        except OSError as error:
            message = f"cannot remove the claim's files on the node: {error}"
        except Exception as error:  # a bug, or a request the kubelet should not send: this claim only
            log.exception("unpreparing %s/%s (%r) failed", claim.namespace, claim.name, claim.uid)
            message = f"unexpected error unpreparing the claim: {error}"
        else:
            return pb.NodeUnprepareResourceResponse()
        log.warning("cannot unprepare ResourceClaim %s/%s: %s", claim.namespace, claim.name, message)
        return pb.NodeUnprepareResourceResponse(error=message)


def _device(pb: ModuleType, d: PreparedDevice) -> Any:
    fields: dict[str, Any] = {
        "request_names": list(d.request_names),
        "pool_name": d.pool,
        "device_name": d.device,
        "cdi_device_ids": list(d.cdi_device_ids),
    }
    if d.share_id and pb is v1:  # v1beta1 has no share_id
        fields["share_id"] = d.share_id
    return pb.Device(**fields)


class _V1Servicer:
    def __init__(self, service: DraService) -> None:
        self._service = service

    def NodePrepareResources(self, request: Any, context: grpc.ServicerContext) -> Any:
        return self._service.prepare(request, v1)

    def NodeUnprepareResources(self, request: Any, context: grpc.ServicerContext) -> Any:
        return self._service.unprepare(request, v1)


class _V1Beta1Servicer:
    def __init__(self, service: DraService) -> None:
        self._service = service

    def NodePrepareResources(self, request: Any, context: grpc.ServicerContext) -> Any:
        return self._service.prepare(request, v1beta1)

    def NodeUnprepareResources(self, request: Any, context: grpc.ServicerContext) -> Any:
        return self._service.unprepare(request, v1beta1)


def add_to_server(server: grpc.Server, service: DraService) -> None:
    """Register ``service`` as both v1 and v1beta1 DRAPlugin on ``server``."""
    v1_grpc.add_DRAPluginServicer_to_server(_V1Servicer(service), server)
    v1beta1_grpc.add_DRAPluginServicer_to_server(_V1Beta1Servicer(service), server)
