"""One container's HAMi resources to a GPU request, and a GPU request to a ResourceClaim spec; pure.

Reading rule: for each of the four resource names the container's ``limits`` value is used, else its
``requests`` value (Kubernetes requires the two to be equal for extended resources, and a container
may give either); if both are given and differ the pod is refused. Defaults, for what HAMi users
expect on a driver whose request policy reserves nothing that a claim does not name:

- ``nvidia.com/gpu`` is 1 when only gpumem, gpumem-percentage or gpucores is given;
- no gpumem and no gpumem-percentage means 100 % of each GPU's memory (HAMi's default), never the
  device's default of 0, which would leave the container unable to allocate anything;
- no gpucores means no compute cap (the device's default 0: time-sliced with everyone else).
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from tessera.names import (
    CORES_CAPACITY,
    DEVICE_CLASS,
    DRIVER_NAME,
    HAMI_GPU,
    HAMI_GPUCORES,
    HAMI_GPUMEM,
    HAMI_GPUMEM_PERCENTAGE,
    HAMI_RESOURCES,
    MEMORY_CAPACITY,
    WEBHOOK_MANAGED_BY,
)
from tessera.quantity import MiB, parse_quantity, quote, round_down
from tessera.webhook.fleet import Fleet

REQUEST_NAME = "gpu"
"""The one request of every claim the webhook writes."""

DISTINCT_GPU_ATTRIBUTE = f"{DRIVER_NAME}/uuid"
"""The attribute a claim's constraint keeps distinct so that the shares of one request go to different
GPUs (the driver publishes ``uuid`` in its own domain), as ``nvidia.com/gpu: N`` means in HAMi."""

MAX_SUBREQUESTS = 8
"""DRA allows at most 8 ``firstAvailable`` entries per request."""

DEFAULT_MEMORY_PERCENT = 100

MANAGED_BY_LABEL = "app.kubernetes.io/managed-by"
"""The label that marks the templates the webhook writes (value ``WEBHOOK_MANAGED_BY``): templates.py
uses an existing template only if it carries it, and watches the templates by it."""


class Refusal(ValueError):
    """A request the webhook denies; the message is one sentence naming container, resource and rule."""


@dataclass(frozen=True)
class GpuRequest:
    """What one container asks for, after defaults: ``memory_mib`` or ``memory_percent`` (exactly one
    is set), ``cores`` None for uncapped."""

    count: int
    memory_mib: int | None
    memory_percent: int | None
    cores: int | None


def _whole_number(where: str, name: str, raw: Any) -> int:
    """``raw`` as a whole number of at least 1, through the one bounded parser: a pod may carry any
    string here (the API validates extended resources only after mutating admission)."""
    try:
        value = parse_quantity(raw)
    except ValueError as error:
        raise Refusal(f"{where}: {name} is refused: {error}") from None
    if value.denominator != 1:
        raise Refusal(f"{where}: {name} is {quote(raw)}, which is not a whole number.")
    if value <= 0:
        raise Refusal(f"{where}: {name} is {quote(raw)}; it must be at least 1.")
    return int(value)


def _read(where: str, resources: Mapping[str, Any], name: str) -> int | None:
    limits = resources.get("limits") or {}
    requests = resources.get("requests") or {}
    limit = _whole_number(where, name, limits[name]) if name in limits else None
    request = _whole_number(where, name, requests[name]) if name in requests else None
    if limit is not None and request is not None and limit != request:
        raise Refusal(
            f'{where}: {name} has request "{requests[name]}" and limit "{limits[name]}"; they must be equal.'
        )
    return limit if limit is not None else request


def mentions_gpu(container: Mapping[str, Any]) -> bool:
    """Whether the container names any of the four HAMi resources in its requests or limits."""
    resources = container.get("resources") or {}
    return any(
        name in (resources.get("limits") or {}) or name in (resources.get("requests") or {})
        for name in HAMI_RESOURCES
    )


def read_request(where: str, container: Mapping[str, Any]) -> GpuRequest | None:
    """The container's GPU request with defaults applied, None if it names none of the resources;
    raises Refusal for values no GPU could ever satisfy on their own (fleet-independent rules)."""
    if not mentions_gpu(container):
        return None
    resources = container.get("resources") or {}
    count = _read(where, resources, HAMI_GPU)
    memory = _read(where, resources, HAMI_GPUMEM)
    percent = _read(where, resources, HAMI_GPUMEM_PERCENTAGE)
    cores = _read(where, resources, HAMI_GPUCORES)
    if memory is not None and percent is not None:
        raise Refusal(
            f"{where}: {HAMI_GPUMEM} and {HAMI_GPUMEM_PERCENTAGE} are both given; ask for one of them."
        )
    if percent is not None and percent > 100:
        raise Refusal(f"{where}: {HAMI_GPUMEM_PERCENTAGE} is {percent}; it must be between 1 and 100.")
    if cores is not None and cores > 100:
        raise Refusal(f"{where}: {HAMI_GPUCORES} is {cores}; it must be between 1 and 100.")
    if memory is None and percent is None:
        percent = DEFAULT_MEMORY_PERCENT
    return GpuRequest(count=count or 1, memory_mib=memory, memory_percent=percent, cores=cores)


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


def size_selector(memory_bytes: int) -> str:
    """CEL matching GPUs whose published memory is exactly ``memory_bytes``."""
    return f'device.capacity["{DEVICE_CLASS}"].{MEMORY_CAPACITY}.compareTo(quantity("{memory_bytes}")) == 0'


_SIZE_SELECTOR = re.compile(
    "^" + re.escape(size_selector(0)).replace('quantity\\("0"\\)', 'quantity\\("([0-9]+)"\\)') + "$"
)


def size_from_selector(expression: str) -> int | None:
    """The memory size a :func:`size_selector` expression selects, None for any other expression."""
    match = _SIZE_SELECTOR.match(expression)
    return int(match.group(1)) if match else None


CONTAINER_LISTS = (("initContainers", "init container"), ("containers", "container"))
"""The pod spec's container lists that can ask for a GPU, with how a message names their members."""


ContainerRequest = tuple[str, int, Mapping[str, Any], str, GpuRequest]


def container_requests(spec: Mapping[str, Any]) -> Iterator[ContainerRequest]:
    """Every container of a pod spec that asks for a GPU: (list name, index, container, how messages
    name it, its request). The webhook converts these; the admission check sizes Jobs' pods by them.
    Raises Refusal as :func:`read_request` does."""
    for list_name, label in CONTAINER_LISTS:
        for index, container in enumerate(spec.get(list_name) or []):
            where = f"{label} {quote(container.get('name', index))}"
            request = read_request(where, container)
            if request is not None:
                yield list_name, index, container, where, request


def claim_spec(where: str, request: GpuRequest, selectors: list[str], fleet: Fleet) -> dict[str, Any]:
    """The ResourceClaimSpec for ``request``.

    An absolute gpumem becomes one request with ``capacity.requests.memory``. A percentage becomes a
    ``firstAvailable`` list with one subrequest per distinct GPU memory size the fleet publishes
    (largest first), each selecting only GPUs of that size and asking that size's share, so the
    scheduler takes whichever fits the node it picks. A count above 1 adds a constraint that the
    request's shares (of whichever subrequest) have distinct GPU UUIDs: N GPUs, as in HAMi, never N
    shares of one GPU (the devices allow multiple allocations)."""
    if request.memory_mib is not None:
        body = _device_request(request.count, selectors, request.memory_mib * MiB, request.cores)
        return _with_distinct_gpus(request.count, {"name": REQUEST_NAME, "exactly": body})
    percent = request.memory_percent or DEFAULT_MEMORY_PERCENT
    if not fleet.memory_sizes:
        raise Refusal(
            f"{where}: {HAMI_GPUMEM_PERCENTAGE} {percent} cannot be converted because no "
            f"{DEVICE_CLASS} GPU is published yet."
        )
    if len(fleet.memory_sizes) > MAX_SUBREQUESTS:
        raise Refusal(
            f"{where}: {HAMI_GPUMEM_PERCENTAGE} needs one choice per GPU memory size and the cluster "
            f"has {len(fleet.memory_sizes)} sizes, more than DRA's {MAX_SUBREQUESTS}; ask {HAMI_GPUMEM}."
        )
    subrequests = []
    for size in fleet.memory_sizes:
        share = round_down(size * percent // 100, MiB)
        if share == 0:
            continue
        body = _device_request(request.count, [size_selector(size), *selectors], share, request.cores)
        subrequests.append({"name": f"m{size // MiB}mi", **body})
    return _with_distinct_gpus(request.count, {"name": REQUEST_NAME, "firstAvailable": subrequests})


def _with_distinct_gpus(count: int, request: dict[str, Any]) -> dict[str, Any]:
    """The claim spec of ``request``; for a count above 1, with the constraint that its devices (those
    of any of its subrequests too: the constraint names the parent request) differ in UUID."""
    devices: dict[str, Any] = {"requests": [request]}
    if count > 1:
        devices["constraints"] = [
            {"requests": [request["name"]], "distinctAttribute": DISTINCT_GPU_ATTRIBUTE}
        ]
    return {"devices": devices}


def template_name(spec: Mapping[str, Any]) -> str:
    """``tessera-`` and a hash of the canonical JSON of the claim spec: identical shapes, one name."""
    canonical = json.dumps(spec, sort_keys=True, separators=(",", ":"))
    return "tessera-" + hashlib.sha256(canonical.encode()).hexdigest()[:20]


def claim_template(namespace: str, spec: Mapping[str, Any]) -> dict[str, Any]:
    """The ResourceClaimTemplate object (JSON) carrying ``spec`` under its hashed name."""
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaimTemplate",
        "metadata": {
            "name": template_name(spec),
            "namespace": namespace,
            "labels": {MANAGED_BY_LABEL: WEBHOOK_MANAGED_BY},
        },
        "spec": {"spec": dict(spec)},
    }
