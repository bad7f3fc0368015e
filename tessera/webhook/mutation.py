"""The pod's JSONPatch: remove the HAMi extended resources (the four, priority and MIG), add one
pod claim per converted container pointing at its template, and reference that claim from the container; pure.

Paths are built for the pod exactly as the review carries it (lists present or absent), so the patch
applies with no "add to a missing parent" surprise.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from tessera.names import HAMI_MIG_PREFIX, HAMI_PRIORITY, HAMI_RESOURCES

CLAIM_PREFIX = "tessera-"
_MAX_NAME = 63


@dataclass(frozen=True)
class Converted:
    """One container to rewrite: where it sits in the pod and which template its claim uses."""

    list_name: str  # "containers" or "initContainers"
    index: int
    container: Mapping[str, Any]
    template: str

    @property
    def claim_name(self) -> str:
        return pod_claim_name(self.list_name, str(self.container.get("name", "")))


def pod_claim_name(list_name: str, container_name: str) -> str:
    """The pod-level claim entry for a container: ``tessera-<container>`` when that is a valid name
    length, otherwise a short hash (container and init container names are unique within a pod)."""
    name = CLAIM_PREFIX + container_name
    if len(name) <= _MAX_NAME and container_name:
        return name
    digest = hashlib.sha256(f"{list_name}/{container_name}".encode()).hexdigest()[:16]
    return CLAIM_PREFIX + digest


def _pointer(token: str) -> str:
    """One JSON Pointer token, escaped (RFC 6901): ``nvidia.com/gpu`` -> ``nvidia.com~1gpu``."""
    return token.replace("~", "~0").replace("/", "~1")


def converted_resource(name: str) -> bool:
    """Whether ``name`` is a HAMi resource the claim replaces: nothing offers it as an extended
    resource, so it must leave the pod."""
    return name in HAMI_RESOURCES or name == HAMI_PRIORITY or name.startswith(HAMI_MIG_PREFIX)


def pod_patch(pod: Mapping[str, Any], converted: list[Converted]) -> list[dict[str, Any]]:
    """JSONPatch operations that apply ``converted`` to ``pod``."""
    operations: list[dict[str, Any]] = []
    for item in converted:
        base = f"/spec/{item.list_name}/{item.index}/resources"
        resources = item.container.get("resources") or {}
        for section in ("limits", "requests"):
            for name in resources.get(section) or {}:
                if converted_resource(name):
                    operations.append({"op": "remove", "path": f"{base}/{section}/{_pointer(name)}"})
        reference = {"name": item.claim_name}
        if "claims" in resources and resources["claims"] is not None:
            operations.append({"op": "add", "path": f"{base}/claims/-", "value": reference})
        else:
            operations.append({"op": "add", "path": f"{base}/claims", "value": [reference]})
    entries = [{"name": item.claim_name, "resourceClaimTemplateName": item.template} for item in converted]
    spec = pod.get("spec") or {}
    if spec.get("resourceClaims"):
        operations.extend(
            {"op": "add", "path": "/spec/resourceClaims/-", "value": entry} for entry in entries
        )
    elif entries:
        operations.append({"op": "add", "path": "/spec/resourceClaims", "value": entries})
    return operations
