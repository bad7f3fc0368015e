"""A node's daemon credentials on the real API server: the kubelet plugin writes its own node's
ResourceSlices of its own driver and the status of the claims allocated to its node, and nothing of
another node's.

The plugin's credentials here are what a DaemonSet pod's are: a token of the chart's plugin account
that names its node (``kubectl create token --bound-object-kind Node``: the TokenRequest API with the
Node as bound object), so the API server adds ``authentication.kubernetes.io/node-name`` to the user.
Slices are the chart's ValidatingAdmissionPolicy's to guard; claim statuses the API server's own
(``resourceclaims/driver`` with ``associated-node:patch``, which holds only for a claim whose
allocation selects the token's node, and ``resourceclaims/binding`` for the allocation itself, which
the plugin is not granted).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from tessera.driver.claim_status import status_apply
from tessera.kube import api_client, raw_json
from tessera.names import DRIVER_NAME
from testbed.accounts import token_kubeconfig
from testbed.cluster import LocalCluster
from testbed.dra_objects import allocated_claim
from testbed.polling import poll_until
from tests.chart_helm import Release, installed

pytestmark = pytest.mark.integration

OWN_NODE_ONLY = "may write only the ResourceSlices of its own node"


@pytest.fixture(scope="module")
def release(
    cluster: LocalCluster, kube: client.ApiClient, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Release]:
    values = {
        "deviceClass": {"enabled": False},
        "webhook": {"enabled": False},
    }
    with installed(cluster, kube, tmp_path_factory.mktemp("slice-policy"), values) as release:
        yield release


def plugin_client(
    cluster: LocalCluster, kube: client.ApiClient, release: Release, folder: Path, node: str | None
) -> client.ResourceV1Api:
    """The ResourceSlice API as the release's plugin account, with a token bound to ``node`` (None: a
    plain token, which names no node)."""
    account = release.object_name("kubeletplugin")
    spec: dict[str, Any] = {"expirationSeconds": 3600}
    if node is not None:
        uid = raw_json(client.CoreV1Api(kube).read_node(node, _preload_content=False))["metadata"]["uid"]
        spec["boundObjectRef"] = {"apiVersion": "v1", "kind": "Node", "name": node, "uid": uid}
    request = client.AuthenticationV1TokenRequest.model_validate({"spec": spec})
    status = (
        client.CoreV1Api(kube)
        .create_namespaced_service_account_token(account, release.namespace, request)
        .status
    )
    assert status is not None
    kubeconfig = token_kubeconfig(cluster, str(status.token), account, folder / f"plugin-{node}.kubeconfig")
    return client.ResourceV1Api(api_client(kubeconfig))


def slice_body(node: str | None, name: str, driver: str = DRIVER_NAME) -> client.V1ResourceSlice:
    """A slice as ``driver`` publishes it for ``node`` (None: one for all nodes)."""
    where: dict[str, Any] = {"nodeName": node} if node else {"allNodes": True}
    body = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceSlice",
        "metadata": {"name": name},
        "spec": {
            "driver": driver,
            "pool": {"name": node or "fleet", "generation": 1, "resourceSliceCount": 1},
            **where,
            "devices": [{"name": "gpu-0"}],
        },
    }
    return client.V1ResourceSlice.model_validate(body)


def refusal(call: Callable[[], object]) -> str:
    """The API server's message refusing ``call`` (which must be refused with 403)."""
    with pytest.raises(ApiException) as caught:
        call()
    assert caught.value.status == 403, caught.value.body
    return str(caught.value.body)


@pytest.fixture
def nodes(fake_node: Callable[..., str]) -> tuple[str, str]:
    return fake_node(), fake_node()


@pytest.fixture
def slices(kube: client.ApiClient) -> Iterator[list[str]]:
    """Names of slices a test made; deleted afterwards by the admin."""
    made: list[str] = []
    yield made
    admin = client.ResourceV1Api(kube)
    for name in made:
        try:
            admin.delete_resource_slice(name)
        except ApiException as error:
            if error.status != 404:
                raise


def wait_for_the_policy(plugin: client.ResourceV1Api, admin: client.ResourceV1Api, foreign: str) -> str:
    """The API server compiles a new policy in the background: retry a foreign write (undoing it if
    it got through) until the policy refuses it; its message."""
    message: list[str] = []

    def refused() -> bool:
        try:
            plugin.create_resource_slice(slice_body(foreign, f"probe-{foreign}"))
        except ApiException as error:
            if error.status == 403 and OWN_NODE_ONLY in str(error.body):
                message.append(str(error.body))
                return True
            raise
        admin.delete_resource_slice(f"probe-{foreign}")
        return False

    poll_until(refused, 60, "the ResourceSlice policy in force")
    return message[0]


def test_a_plugin_writes_its_own_nodes_slice_and_no_other_nodes(
    cluster: LocalCluster,
    kube: client.ApiClient,
    release: Release,
    nodes: tuple[str, str],
    slices: list[str],
    tmp_path: Path,
) -> None:
    own, other = nodes
    admin = client.ResourceV1Api(kube)
    plugin = plugin_client(cluster, kube, release, tmp_path, own)
    message = wait_for_the_policy(plugin, admin, other)
    assert f"the Tessera kubelet plugin on node {own} {OWN_NODE_ONLY}, not those of node {other}" in message

    # Its own node's slice: create, update, delete.
    mine = f"{own}-{DRIVER_NAME}"
    slices.append(mine)
    created = plugin.create_resource_slice(slice_body(own, mine))
    created.spec.pool.generation = 2
    plugin.replace_resource_slice(mine, created)
    plugin.delete_resource_slice(mine)

    # Another node's slice (made by someone the policy does not restrict): no update, no delete.
    theirs = f"{other}-{DRIVER_NAME}"
    slices.append(theirs)
    existing = admin.create_resource_slice(slice_body(other, theirs))
    assert OWN_NODE_ONLY in refusal(lambda: plugin.replace_resource_slice(theirs, existing))
    assert OWN_NODE_ONLY in refusal(lambda: plugin.delete_resource_slice(theirs))
    admin.read_resource_slice(theirs)  # still there

    # A slice for no node in particular is no node's own.
    slices.append("everywhere")
    assert "not one without a node" in refusal(
        lambda: plugin.create_resource_slice(slice_body(None, "everywhere"))
    )


def test_a_plugin_token_that_names_no_node_writes_no_slice(
    cluster: LocalCluster,
    kube: client.ApiClient,
    release: Release,
    nodes: tuple[str, str],
    slices: list[str],
    tmp_path: Path,
) -> None:
    own, other = nodes
    admin = client.ResourceV1Api(kube)
    wait_for_the_policy(plugin_client(cluster, kube, release, tmp_path, own), admin, other)
    unbound = plugin_client(cluster, kube, release, tmp_path, None)
    slices.append(f"{own}-{DRIVER_NAME}")
    message = refusal(lambda: unbound.create_resource_slice(slice_body(own, f"{own}-{DRIVER_NAME}")))
    assert "credentials name no node" in message


def test_a_plugin_writes_no_slice_of_another_driver_on_its_own_node(
    cluster: LocalCluster,
    kube: client.ApiClient,
    release: Release,
    nodes: tuple[str, str],
    slices: list[str],
    tmp_path: Path,
) -> None:
    own, other = nodes
    admin = client.ResourceV1Api(kube)
    plugin = plugin_client(cluster, kube, release, tmp_path, own)
    wait_for_the_policy(plugin, admin, other)

    slices.append(f"{own}-gpu.example.com")
    message = refusal(
        lambda: plugin.create_resource_slice(slice_body(own, f"{own}-gpu.example.com", "gpu.example.com"))
    )
    assert (
        f"may write only the ResourceSlices of driver {DRIVER_NAME}, not those of driver gpu.example.com"
        in message
    )

    # Nor take over one that driver published there.
    theirs = f"{own}-gpu.example.com"
    existing = admin.create_resource_slice(slice_body(own, theirs, "gpu.example.com"))
    assert "not those of driver gpu.example.com" in refusal(lambda: plugin.delete_resource_slice(theirs))
    existing.spec.pool.generation = 2
    assert "not those of driver gpu.example.com" in refusal(
        lambda: plugin.replace_resource_slice(theirs, existing)
    )


# ------------------------------------------------------------------------------------ claim status


def write_status(plugin: client.ResourceV1Api, claim: tuple[str, str, str], node: str) -> None:
    """What the daemon on ``node`` writes into the claim after a prepare (tessera/driver/claim_status.py):
    a Ready condition on the claim's shares in ``node``'s pool."""
    namespace, name, _ = claim
    stored = raw_json(plugin.read_namespaced_resource_claim(name, namespace, _preload_content=False))
    body = status_apply(stored, DRIVER_NAME, node, None, datetime.now(UTC))
    assert body is not None, f"claim {name} has no share in {node}'s pool"
    plugin.patch_namespaced_resource_claim_status(
        name,
        namespace,
        body,
        field_manager=f"{DRIVER_NAME}/{node}",
        force=True,
        _content_type="application/apply-patch+yaml",
    )


def ready_conditions(admin: client.ResourceV1Api, claim: tuple[str, str, str]) -> list[str]:
    namespace, name, _ = claim
    stored = raw_json(admin.read_namespaced_resource_claim(name, namespace, _preload_content=False))
    return [
        c["status"]
        for device in (stored.get("status") or {}).get("devices") or []
        for c in device.get("conditions") or []
    ]


def status_refusal(call: Callable[[], object]) -> str:
    """The API server's message refusing a status write (403 from RBAC or a policy, 422 from the
    claim's own authorization of ``status.devices``)."""
    with pytest.raises(ApiException) as caught:
        call()
    assert caught.value.status in (403, 422), caught.value.body
    return str(caught.value.body)


def test_a_plugin_writes_the_status_of_its_own_nodes_claims_and_not_of_another_nodes(
    cluster: LocalCluster,
    kube: client.ApiClient,
    release: Release,
    nodes: tuple[str, str],
    namespace: str,
    tmp_path: Path,
) -> None:
    own, other = nodes
    admin = client.ResourceV1Api(kube)
    mine = allocated_claim(admin, namespace, own, "gpu-0", "mine")
    theirs = allocated_claim(admin, namespace, other, "gpu-0", "theirs")
    plugin = plugin_client(cluster, kube, release, tmp_path, own)

    write_status(plugin, mine, own)
    assert ready_conditions(admin, mine) == ["True"]

    # The other node's claim, written as that node's daemon would write it: refused, left unwritten.
    # For a claim not allocated to the token's node the API server asks arbitrary-node:patch, which
    # the plugin's account does not hold.
    message = status_refusal(lambda: write_status(plugin, theirs, other))
    assert "cannot arbitrary-node:patch" in message, message
    assert ready_conditions(admin, theirs) == []

    # Its own claim's allocation is the scheduler's: the plugin cannot take it back.
    namespace_, name, _ = mine
    message = status_refusal(
        lambda: plugin.patch_namespaced_resource_claim_status(
            name, namespace_, {"status": {"allocation": None}}, _content_type="application/merge-patch+json"
        )
    )
    assert "resourceclaims/binding" in message, message
    assert raw_json(admin.read_namespaced_resource_claim(name, namespace_, _preload_content=False))["status"][
        "allocation"
    ]


def test_a_plugin_token_that_names_no_node_writes_no_claim_status(
    cluster: LocalCluster,
    kube: client.ApiClient,
    release: Release,
    nodes: tuple[str, str],
    namespace: str,
    tmp_path: Path,
) -> None:
    own, _ = nodes
    admin = client.ResourceV1Api(kube)
    mine = allocated_claim(admin, namespace, own, "gpu-0", "mine")
    unbound = plugin_client(cluster, kube, release, tmp_path, None)

    message = status_refusal(lambda: write_status(unbound, mine, own))
    assert "cannot arbitrary-node:patch" in message, message
    assert ready_conditions(admin, mine) == []
