"""A pod that holds a share of a GPU, placed by the real scheduler: where driver and exporter tests
start from when the node has no kubelet to run it.

The pod is bound to a named node; its claim comes from a ResourceClaimTemplate asking the given
capacity of Tessera's DeviceClass; the function returns once the controller manager has made the
claim and the scheduler has allocated it, as the kubelet would then name it to the driver.
"""

from __future__ import annotations

from typing import Any

from kubernetes import client

from tessera.kube import raw_json
from tessera.names import DEVICE_CLASS
from testbed.dra_objects import share_claim_template
from testbed.kubelet_client import ClaimRef
from testbed.pod_state import generated_claim_name, wait_until_bound
from testbed.polling import poll_until


def share_pod(
    kube: client.ApiClient,
    namespace: str,
    node: str,
    name: str,
    bind_timeout: float = 60,
    **capacity: str,
) -> ClaimRef:
    """Pod ``name`` on ``node`` whose container uses one claim asking ``capacity``; returns the
    claim once it is allocated (the scheduler binding the pod within ``bind_timeout`` seconds)."""
    resource, core = client.ResourceV1Api(kube), client.CoreV1Api(kube)
    resource.create_namespaced_resource_claim_template(
        namespace, share_claim_template(name, DEVICE_CLASS, capacity)
    )
    core.create_namespaced_pod(
        namespace,
        client.V1Pod.model_validate(
            {
                "metadata": {"name": name},
                "spec": {
                    "nodeSelector": {"kubernetes.io/hostname": node},
                    "resourceClaims": [{"name": "gpu", "resourceClaimTemplateName": name}],
                    "containers": [
                        {"name": "main", "image": "none", "resources": {"claims": [{"name": "gpu"}]}}
                    ],
                },
            }
        ),
    )
    wait_until_bound(core, namespace, name, bind_timeout)
    claim_name = poll_until(
        lambda: generated_claim_name(core.read_namespaced_pod(name, namespace), "gpu"), 30, "claim made"
    )

    def allocated() -> dict[str, Any] | None:
        body = raw_json(
            resource.read_namespaced_resource_claim(claim_name, namespace, _preload_content=False)
        )
        return body if (body.get("status") or {}).get("allocation") else None

    claim = poll_until(allocated, 30, f"{claim_name} allocated")
    return namespace, claim_name, str(claim["metadata"]["uid"])
