"""Pods that call the API server from inside the test bed: where they find it.

A pod finds the API server through the ``kubernetes`` Service (the kubelet sets
KUBERNETES_SERVICE_HOST and _PORT to its ClusterIP and port), and kube-proxy routes that to the API
server. The test bed has no kube-proxy, so nothing answers at the ClusterIP. Instead, the API server
listens on every address of the machine and its certificate names every node address
(cluster.py), and the MutatingAdmissionPolicy here sets the two variables in each container of the
pods of chosen namespaces to the pod's node address (``status.hostIP``: on the node's bridge, which is
the pods' gateway) and the API server's port. In-cluster clients then work unchanged, and what the
pod's own manifest says is left as it is. Namespaces opt in with ``LABEL``.
"""

from __future__ import annotations

from typing import Any

from kubernetes import client

from tessera.kube import create_if_absent, raw_json
from testbed.cluster import LocalCluster
from testbed.polling import poll_until

LABEL = "testbed.tessera.dev/apiserver-at-node-address"
POLICY = "tessera-testbed-apiserver-at-node-address"


# JSONPatch paths need container indexes, which CEL's macros do not give: pods of up to this many
# containers are covered.
_MAX_CONTAINERS = 16


def _patch_expression(port: int) -> str:
    """CEL for the JSONPatch: an empty env where a container has none, then the two variables
    appended to each container's env, the host from the downward API."""
    indexes = f"[{', '.join(map(str, range(_MAX_CONTAINERS)))}].filter(i, i < size(object.spec.containers))"
    path = '"/spec/containers/" + string(i) + "/env"'
    host = (
        'Object.spec.containers.env{name: "KUBERNETES_SERVICE_HOST", '
        "valueFrom: Object.spec.containers.env.valueFrom{fieldRef: "
        'Object.spec.containers.env.valueFrom.fieldRef{fieldPath: "status.hostIP"}}}'
    )
    port_var = f'Object.spec.containers.env{{name: "KUBERNETES_SERVICE_PORT", value: "{port}"}}'
    return (
        f"{indexes}.filter(i, !has(object.spec.containers[i].env))"
        f'.map(i, JSONPatch{{op: "add", path: {path}, value: []}})'
        f' + {indexes}.map(i, JSONPatch{{op: "add", path: {path} + "/-", value: {host}}})'
        f' + {indexes}.map(i, JSONPatch{{op: "add", path: {path} + "/-", value: {port_var}}})'
    )


def policy(port: int) -> dict[str, Any]:
    """The MutatingAdmissionPolicy: every container of a new pod gets the two variables."""
    return {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "MutatingAdmissionPolicy",
        "metadata": {"name": POLICY},
        "spec": {
            "matchConstraints": {
                "resourceRules": [
                    {
                        "apiGroups": [""],
                        "apiVersions": ["v1"],
                        "operations": ["CREATE"],
                        "resources": ["pods"],
                    }
                ]
            },
            "failurePolicy": "Fail",
            "reinvocationPolicy": "Never",
            "mutations": [{"patchType": "JSONPatch", "jsonPatch": {"expression": _patch_expression(port)}}],
        },
    }


def binding() -> dict[str, Any]:
    return {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "MutatingAdmissionPolicyBinding",
        "metadata": {"name": POLICY},
        "spec": {
            "policyName": POLICY,
            "matchResources": {"namespaceSelector": {"matchLabels": {LABEL: "true"}}},
        },
    }


def let_pods_reach_apiserver(kube: client.ApiClient, cluster: LocalCluster) -> None:
    """Install the policy and its binding (once per cluster); label a namespace with ``LABEL`` for
    its new pods to get the variables."""
    custom = client.CustomObjectsApi(kube)
    group, version = "admissionregistration.k8s.io", "v1"
    create_if_absent(
        custom.create_cluster_custom_object,
        group,
        version,
        "mutatingadmissionpolicies",
        policy(cluster.api_port),
    )
    create_if_absent(
        custom.create_cluster_custom_object, group, version, "mutatingadmissionpolicybindings", binding()
    )


def wait_effective(kube: client.ApiClient, namespace: str, timeout: float = 60) -> None:
    """Until a pod created in ``namespace`` (a dry run) gets the variables: the API server applies
    a new policy once its informers have seen it."""
    core = client.CoreV1Api(kube)
    probe = {
        "metadata": {"name": "apiserver-access-probe"},
        "spec": {"containers": [{"name": "c", "image": "x"}]},
    }

    def effective() -> bool:
        body = client.V1Pod.model_validate(probe)
        pod = raw_json(core.create_namespaced_pod(namespace, body, dry_run="All", _preload_content=False))
        return any(
            e["name"] == "KUBERNETES_SERVICE_HOST" for e in pod["spec"]["containers"][0].get("env", [])
        )

    poll_until(effective, timeout, f"pods in {namespace} told where the API server is")
