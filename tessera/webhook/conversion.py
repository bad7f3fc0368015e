"""A GPU request (tessera/gpu_request.py) to a ResourceClaimTemplate: the claim spec the scheduler
reads, with the request itself recorded beside it for the admission check; pure."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from dataclasses import replace
from typing import Any

from tessera.gpu_request import (
    DEFAULT_MEMORY_PERCENT,
    DEFAULT_PRIORITY,
    MAX_MEMORY_SIZES,
    GpuRequest,
    MigRequest,
    Refusal,
    Selection,
    request_to_annotation,
    share_of,
)
from tessera.names import (
    CORES_CAPACITY,
    DEVICE_CLASS,
    DRIVER_NAME,
    GPU_REQUEST_ANNOTATION,
    HAMI_GPUMEM,
    HAMI_GPUMEM_PERCENTAGE,
    MANAGED_BY_LABEL,
    MEMORY_CAPACITY,
    MIG_DEVICE_CLASS,
    MIG_PROFILE_ATTRIBUTE,
    WEBHOOK_MANAGED_BY,
)
from tessera.quantity import MiB
from tessera.selection_cel import cel_string, selection_cel, size_selector
from tessera.webhook.fleet import Fleet

REQUEST_NAME = "gpu"
"""The one request of every share claim the webhook writes."""

MIG_REQUEST_NAME = "mig"
"""The one request of every MIG claim the webhook writes."""

SHARE_CONFIG_API_VERSION = f"{DRIVER_NAME}/v1"
SHARE_CONFIG_KIND = "ShareConfig"
"""The opaque configuration the driver reads a share's non-default settings from."""

DISTINCT_GPU_ATTRIBUTE = f"{DRIVER_NAME}/uuid"
"""The attribute a claim's constraint keeps distinct so that the shares of one request go to different
GPUs (the driver publishes ``uuid`` in its own domain), as ``nvidia.com/gpu: N`` means in HAMi."""


def _device_request(count: int, selectors: list[str], memory_bytes: int, cores: int | None) -> dict[str, Any]:
    capacity = {MEMORY_CAPACITY: f"{memory_bytes // MiB}Mi"}
    if cores is not None:
        capacity[CORES_CAPACITY] = str(cores)
    request: dict[str, Any] = {
        "deviceClassName": DEVICE_CLASS,
        "allocationMode": "ExactCount",
        "count": count,
    }
    if selectors:
        request["selectors"] = [{"cel": {"expression": expression}} for expression in selectors]
    request["capacity"] = {"requests": capacity}
    return request


def converted(where: str, request: GpuRequest, fleet: Fleet) -> GpuRequest:
    """``request`` as the webhook converts it: a percentage with the GPU memory sizes its claim has a
    choice for (those of the fleet, largest first, whose share is at least 1 MiB); raises Refusal when
    there is no such size or more than DRA allows choices."""
    if request.memory is not None:
        return request
    percent = request.memory_percent or DEFAULT_MEMORY_PERCENT
    if not fleet.memory_sizes:
        raise Refusal(
            f"{where}: {HAMI_GPUMEM_PERCENTAGE} {percent} cannot be converted because no "
            f"{DEVICE_CLASS} GPU is published yet."
        )
    if len(fleet.memory_sizes) > MAX_MEMORY_SIZES:
        raise Refusal(
            f"{where}: {HAMI_GPUMEM_PERCENTAGE} needs one choice per GPU memory size and the cluster "
            f"has {len(fleet.memory_sizes)} sizes, more than DRA's {MAX_MEMORY_SIZES}; ask {HAMI_GPUMEM}."
        )
    sizes = tuple(size for size in fleet.memory_sizes if share_of(size, percent))
    if not sizes:
        raise Refusal(
            f"{where}: {HAMI_GPUMEM_PERCENTAGE} {percent} is less than 1 MiB of every published GPU; "
            f"ask {HAMI_GPUMEM}."
        )
    return replace(request, memory_percent=percent, memory_sizes=sizes)


def claim_spec(request: GpuRequest) -> dict[str, Any]:
    """The ResourceClaimSpec for a :func:`converted` request.

    An absolute gpumem becomes one request with ``capacity.requests.memory``. A percentage becomes a
    ``firstAvailable`` list with one subrequest per GPU memory size it was converted for (largest
    first), each selecting only GPUs of that size and asking that size's share, so the scheduler takes
    whichever fits the node it picks. A count above 1 adds a constraint that the request's shares (of
    whichever subrequest) have distinct GPU UUIDs: N GPUs, as in HAMi, never N shares of one GPU (the
    devices allow multiple allocations)."""
    selectors = selection_cel(request.selection)
    if request.memory is not None:
        body = _device_request(request.count, selectors, request.memory, request.cores)
        spec = _with_distinct_gpus(request.count, {"name": REQUEST_NAME, "exactly": body})
    else:
        percent = request.memory_percent or DEFAULT_MEMORY_PERCENT
        subrequests = []
        for size in request.memory_sizes:
            share = share_of(size, percent)
            body = _device_request(request.count, [size_selector(size), *selectors], share, request.cores)
            subrequests.append({"name": f"m{size // MiB}mi", **body})
        spec = _with_distinct_gpus(request.count, {"name": REQUEST_NAME, "firstAvailable": subrequests})
    config = share_config(request)
    if config:
        spec["devices"]["config"] = [
            {"requests": [REQUEST_NAME], "opaque": {"driver": DRIVER_NAME, "parameters": config}}
        ]
    return spec


def share_config(request: GpuRequest) -> dict[str, Any]:
    """The ShareConfig parameters for the settings of ``request`` that differ from the driver's
    defaults (priority 1, enforcement on), only those keys; empty when none differ, so a claim of
    default settings carries no configuration."""
    keys: dict[str, Any] = {}
    if request.priority != DEFAULT_PRIORITY:
        keys["priority"] = request.priority
    if not request.enforce:
        keys["enforcement"] = "off"
    if not keys:
        return {}
    return {"apiVersion": SHARE_CONFIG_API_VERSION, "kind": SHARE_CONFIG_KIND, **keys}


def _with_distinct_gpus(count: int, request: dict[str, Any]) -> dict[str, Any]:
    """The claim spec of ``request``; for a count above 1, with the constraint that its devices (those
    of any of its subrequests too: the constraint names the parent request) differ in UUID."""
    devices: dict[str, Any] = {"requests": [request]}
    if count > 1:
        devices["constraints"] = [
            {"requests": [request["name"]], "distinctAttribute": DISTINCT_GPU_ATTRIBUTE}
        ]
    return {"devices": devices}


def mig_claim_spec(mig: MigRequest, selection: Selection) -> dict[str, Any]:
    """The ResourceClaimSpec for ``nvidia.com/mig-<profile>: N``: N devices of the MIG class whose
    profile is exactly the one asked (quoted by :func:`cel_string`, the only way user text enters
    CEL), plus the pod's selectors. MIG instances are exclusive devices, so N of them are N
    different instances without a constraint."""
    attribute = f"device.attributes[{cel_string(DRIVER_NAME)}].{MIG_PROFILE_ATTRIBUTE}"
    profile = f"{attribute} == {cel_string(mig.profile)}"
    body = {
        "deviceClassName": MIG_DEVICE_CLASS,
        "allocationMode": "ExactCount",
        "count": mig.count,
        "selectors": [{"cel": {"expression": e}} for e in (profile, *selection_cel(selection))],
    }
    return {"devices": {"requests": [{"name": MIG_REQUEST_NAME, "exactly": body}]}}


def template_name(spec: Mapping[str, Any]) -> str:
    """``tessera-`` and a hash of the canonical JSON of the template's spec (the claim spec and the
    recorded request): identical shapes, one name."""
    canonical = json.dumps(spec, sort_keys=True, separators=(",", ":"))
    return "tessera-" + hashlib.sha256(canonical.encode()).hexdigest()[:20]


def claim_template(namespace: str, where: str, request: GpuRequest, fleet: Fleet) -> dict[str, Any]:
    """The ResourceClaimTemplate object (JSON) for ``request`` under its hashed name: the claim spec,
    and the :func:`converted` request in the claim metadata's annotation
    :data:`~tessera.names.GPU_REQUEST_ANNOTATION` (kube-controller-manager copies it onto every
    claim made from the template), which is what the admission check reads. Raises Refusal."""
    done = converted(where, request, fleet)
    return _template(
        namespace,
        {
            "metadata": {"annotations": {GPU_REQUEST_ANNOTATION: request_to_annotation(done)}},
            "spec": claim_spec(done),
        },
    )


def mig_claim_template(namespace: str, mig: MigRequest, selection: Selection) -> dict[str, Any]:
    """The ResourceClaimTemplate object (JSON) for a MIG request. It records no GPU request: the
    admission check reads it by its structure, where a class other than the share class counts for
    nothing (it packs shares, not MIG instances)."""
    return _template(namespace, {"spec": mig_claim_spec(mig, selection)})


def _template(namespace: str, spec: dict[str, Any]) -> dict[str, Any]:
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaimTemplate",
        "metadata": {
            "name": template_name(spec),
            "namespace": namespace,
            "labels": {MANAGED_BY_LABEL: WEBHOOK_MANAGED_BY},
        },
        "spec": spec,
    }
