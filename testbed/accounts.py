"""Service accounts holding exactly a chart's ClusterRole rules, and kubeconfigs with their tokens.

Tests and benchmarks run Tessera's daemons as the chart will: under an account bound to the rules
file the chart ships (charts/tessera/files/*-rules.yaml), never as the cluster admin, so a missing
or excessive permission shows up in the tests.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml
from kubernetes import client

from tessera.kube import create_if_absent
from testbed.cluster import LocalCluster


def service_account_token(
    kube: client.ApiClient,
    namespace: str,
    account: str,
    rules: Sequence[Mapping[str, Any]],
    expiration_seconds: int = 86400,
    bound_to: Mapping[str, str] | None = None,
) -> str:
    """A token of ``namespace/account``, bound by a ClusterRole of that name to ``rules`` only
    (all made if missing). ``bound_to`` names an object the token is bound to (a Node gives the
    token the node's name, as a DaemonSet pod's token has)."""
    core, rbac = client.CoreV1Api(kube), client.RbacAuthorizationV1Api(kube)
    create_if_absent(core.create_namespace, client.V1Namespace(metadata=client.V1ObjectMeta(name=namespace)))
    create_if_absent(
        core.create_namespaced_service_account,
        namespace,
        client.V1ServiceAccount(metadata=client.V1ObjectMeta(name=account)),
    )
    role = {"metadata": {"name": account}, "rules": list(rules)}
    create_if_absent(rbac.create_cluster_role, client.V1ClusterRole.model_validate(role))
    binding = {
        "metadata": {"name": account},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": account},
        "subjects": [{"kind": "ServiceAccount", "name": account, "namespace": namespace}],
    }
    create_if_absent(rbac.create_cluster_role_binding, client.V1ClusterRoleBinding.model_validate(binding))
    spec: dict[str, Any] = {"expirationSeconds": expiration_seconds}
    if bound_to is not None:
        spec["boundObjectRef"] = dict(bound_to)
    request = client.AuthenticationV1TokenRequest.model_validate({"spec": spec})
    status = core.create_namespaced_service_account_token(account, namespace, request).status
    assert status is not None
    return str(status.token)


def grant_in_namespace(
    kube: client.ApiClient, namespace: str, account: str, role: str, rules: Sequence[Mapping[str, Any]]
) -> None:
    """Bind ``namespace/account`` to ``rules`` in its namespace alone, by a Role and RoleBinding named
    ``role`` (made if missing), as a chart grants what a component needs in the release namespace."""
    rbac = client.RbacAuthorizationV1Api(kube)
    body = {"metadata": {"name": role, "namespace": namespace}, "rules": list(rules)}
    create_if_absent(rbac.create_namespaced_role, namespace, client.V1Role.model_validate(body))
    binding = {
        "metadata": {"name": role, "namespace": namespace},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": role},
        "subjects": [{"kind": "ServiceAccount", "name": account, "namespace": namespace}],
    }
    create_if_absent(
        rbac.create_namespaced_role_binding, namespace, client.V1RoleBinding.model_validate(binding)
    )


def token_kubeconfig(cluster: LocalCluster, token: str, user: str, path: Path) -> Path:
    """A kubeconfig for ``cluster`` that authenticates with ``token``."""
    assert cluster.ca is not None, "cluster not started"
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [
            {
                "name": "local",
                "cluster": {"server": cluster.server, "certificate-authority": str(cluster.ca.pair.cert)},
            }
        ],
        "users": [{"name": user, "user": {"token": token}}],
        "contexts": [{"name": "local", "context": {"cluster": "local", "user": user}}],
        "current-context": "local",
    }
    path.write_text(yaml.safe_dump(config))
    return path
