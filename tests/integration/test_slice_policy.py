"""The chart's ValidatingAdmissionPolicy on the real API server: a node's kubelet plugin writes its own
node's ResourceSlices and no other node's.

The plugin's credentials here are what a DaemonSet pod's are: a token of the chart's plugin account
that names its node (``kubectl create token --bound-object-kind Node``: the TokenRequest API with the
Node as bound object), so the API server adds ``authentication.kubernetes.io/node-name`` to the user.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from tessera.kube import api_client, raw_json
from tessera.names import DRIVER_NAME
from testbed.accounts import token_kubeconfig
from testbed.cluster import LocalCluster
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


def slice_body(node: str | None, name: str) -> client.V1ResourceSlice:
    """A slice as the driver publishes it for ``node`` (None: one for all nodes)."""
    where: dict[str, Any] = {"nodeName": node} if node else {"allNodes": True}
    body = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceSlice",
        "metadata": {"name": name},
        "spec": {
            "driver": DRIVER_NAME,
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
