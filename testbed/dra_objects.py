"""Hand-written DRA objects for one shareable simulated GPU, as Tessera's driver will publish them.

The control-plane smoke tests and the demo both use these, so what the demo shows is exactly what
the tests prove. They are written in the resource.k8s.io/v1 JSON shape, as a user would write YAML,
and returned as the client's typed models.
"""

from __future__ import annotations

import uuid
from typing import Any

from kubernetes import client

from tessera.kube import raw_json
from tessera.names import DEVICE_CLASS, DRIVER_NAME


def device_class(name: str) -> client.V1DeviceClass:
    """A DeviceClass selecting every device of Tessera's driver."""
    return client.V1DeviceClass.model_validate(
        {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "DeviceClass",
            "metadata": {"name": name},
            "spec": {"selectors": [{"cel": {"expression": f"device.driver == '{DRIVER_NAME}'"}}]},
        }
    )


def shareable_gpu_slice(
    name: str, node: str, memory: str = "80Gi", cores: int = 100
) -> client.V1ResourceSlice:
    """A ResourceSlice with one GPU on `node` whose memory (1Mi steps) and cores (steps of 1) are
    consumable capacity, so several claims can each take a share of it."""
    return client.V1ResourceSlice.model_validate(
        {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceSlice",
            "metadata": {"name": name},
            "spec": {
                "driver": DRIVER_NAME,
                "nodeName": node,
                "pool": {"name": node, "generation": 1, "resourceSliceCount": 1},
                "devices": [
                    {
                        "name": "gpu-0",
                        "allowMultipleAllocations": True,
                        "attributes": {"uuid": {"string": "GPU-00000000-0000-0000-0000-000000000000"}},
                        "capacity": {
                            "memory": {
                                "value": memory,
                                "requestPolicy": {
                                    "default": "1Mi",
                                    "validRange": {"min": "1Mi", "step": "1Mi"},
                                },
                            },
                            "cores": {
                                "value": str(cores),
                                "requestPolicy": {
                                    "default": "1",
                                    "validRange": {"min": "1", "max": str(cores), "step": "1"},
                                },
                            },
                        },
                    }
                ],
            },
        }
    )


def share_claim_template(
    name: str, device_class_name: str, capacity: dict[str, str]
) -> client.V1ResourceClaimTemplate:
    """A ResourceClaimTemplate with one request named `gpu` for the given capacity."""
    return client.V1ResourceClaimTemplate.model_validate(
        {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceClaimTemplate",
            "metadata": {"name": name},
            "spec": {
                "spec": {
                    "devices": {
                        "requests": [
                            {
                                "name": "gpu",
                                "exactly": {
                                    "deviceClassName": device_class_name,
                                    "capacity": {"requests": capacity},
                                },
                            }
                        ]
                    }
                }
            },
        }
    )


def pod_with_claim(name: str, template: str, image: str = "tessera.local/none") -> client.V1Pod:
    """A pod whose one container uses the claim made from `template`."""
    return client.V1Pod.model_validate(
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": name},
            "spec": {
                "resourceClaims": [{"name": "gpu", "resourceClaimTemplateName": template}],
                "containers": [{"name": "main", "image": image, "resources": {"claims": [{"name": "gpu"}]}}],
            },
        }
    )


def share_claim(name: str, namespace: str, node: str, device: str, memory: str, cores: str) -> dict[str, Any]:
    """A ResourceClaim (JSON) asking a ``memory``/``cores`` share of our class, with the allocation
    the scheduler would write for it on ``device`` of ``node``'s pool in its status."""
    capacity = {"memory": memory, "cores": cores}
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {
            "devices": {
                "requests": [
                    {
                        "name": "gpu",
                        "exactly": {"deviceClassName": DEVICE_CLASS, "capacity": {"requests": capacity}},
                    }
                ]
            }
        },
        "status": {
            "allocation": {
                "devices": {
                    "results": [
                        {
                            "request": "gpu",
                            "driver": DRIVER_NAME,
                            "pool": node,
                            "device": device,
                            "shareID": str(uuid.uuid4()),
                            "consumedCapacity": dict(capacity),
                        }
                    ]
                },
                "nodeSelector": {
                    "nodeSelectorTerms": [
                        {"matchFields": [{"key": "metadata.name", "operator": "In", "values": [node]}]}
                    ]
                },
            }
        },
    }


def allocated_claim(
    resource: client.ResourceV1Api,
    namespace: str,
    node: str,
    device: str,
    name: str,
    memory: str = "1Gi",
    cores: str = "1",
) -> tuple[str, str, str]:
    """A ResourceClaim ``name`` given a ``memory``/``cores`` share of ``device`` on ``node``, its
    allocation written as the scheduler would (no pod needed). Returns (namespace, name, uid), as
    the kubelet names a claim."""
    body = share_claim(name, namespace, node, device, memory, cores)
    status = body.pop("status")
    created = raw_json(
        resource.create_namespaced_resource_claim(
            namespace, client.ResourceV1ResourceClaim.model_validate(body), _preload_content=False
        )
    )
    created["status"] = status
    resource.replace_namespaced_resource_claim_status(
        name, namespace, client.ResourceV1ResourceClaim.model_validate(created)
    )
    return namespace, name, str(created["metadata"]["uid"])
