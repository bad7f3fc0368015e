"""A module's turn on a shared control plane (testbed/shared_cluster.py) against the real API server:
at its end, what the module started beside the control plane stops and every cluster-scoped object
it made is gone, pods stuck on a node without a kubelet included, while what was there before stays;
an object that cannot go is named in the error, with what holds it.

Each test works on the session's cluster: its turn covers only what the test itself makes, since the
tests of one process run one after another.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator

import pytest
from kubernetes import client
from kubernetes.client import ApiException

from testbed.cluster import LocalCluster
from testbed.fake_nodes import create_ready_node
from testbed.names import unique_name
from testbed.process import ManagedProcess
from testbed.shared_cluster import Turn, cluster_scoped_objects

pytestmark = pytest.mark.integration


def exists(read: Callable[[str], object], name: str) -> bool:
    try:
        read(name)
    except ApiException as error:
        if error.status == 404:
            return False
        raise
    return True


def test_a_turn_ends_with_what_it_made_deleted_and_what_it_started_stopped(
    cluster: LocalCluster, kube: client.ApiClient
) -> None:
    core, rbac = client.CoreV1Api(kube), client.RbacAuthorizationV1Api(kube)
    kept = unique_name("kept")
    rbac.create_cluster_role(client.V1ClusterRole(metadata=client.V1ObjectMeta(name=kept)))
    try:
        turn = Turn.begin(cluster)
        assert f"clusterrole.rbac.authorization.k8s.io/{kept}" in turn.objects
        node, namespace, role = unique_name("node"), unique_name("team"), unique_name("role")
        create_ready_node(kube, node)
        core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=namespace)))
        # Bound to a node without a kubelet and with a grace period: only a forced delete removes it.
        pod = {
            "metadata": {"name": "stuck"},
            "spec": {
                "nodeName": node,
                "terminationGracePeriodSeconds": 3600,
                "containers": [{"name": "c", "image": "tessera.local/none"}],
            },
        }
        core.create_namespaced_pod(namespace, client.V1Pod.model_validate(pod))
        rbac.create_cluster_role(client.V1ClusterRole(metadata=client.V1ObjectMeta(name=role)))
        process = ManagedProcess(
            unique_name("beside"), [sys.executable, "-c", "import time; time.sleep(600)"], cluster.log_dir
        )
        cluster.processes.append(process)

        turn.end(timeout=60)

        assert not process.running()
        assert process not in cluster.processes
        assert not exists(core.read_node, node)
        assert not exists(core.read_namespace, namespace)
        assert not exists(rbac.read_cluster_role, role)
        assert exists(rbac.read_cluster_role, kept)
        assert all(p.running() for p in cluster.processes), "the control plane's own processes must stay"
    finally:
        rbac.delete_cluster_role(kept)


@pytest.fixture
def held_role(kube: client.ApiClient) -> Iterator[str]:
    """A ClusterRole name whose object, if made, gets its finalizer taken off afterwards."""
    name = unique_name("held")
    yield name
    rbac = client.RbacAuthorizationV1Api(kube)
    try:
        rbac.patch_cluster_role(name, {"metadata": {"finalizers": None}})
    except ApiException as error:
        if error.status != 404:
            raise


def test_an_object_that_does_not_go_is_named_with_its_finalizers(
    cluster: LocalCluster, kube: client.ApiClient, held_role: str
) -> None:
    turn = Turn.begin(cluster)
    body = client.V1ClusterRole(
        metadata=client.V1ObjectMeta(name=held_role, finalizers=["tessera.dev/test-hold"])
    )
    client.RbacAuthorizationV1Api(kube).create_cluster_role(body)

    with pytest.raises(RuntimeError) as raised:
        turn.end(timeout=3)

    message = str(raised.value)
    assert "kept 1 objects for 3 s after they were deleted" in message
    assert (
        f"clusterrole.rbac.authorization.k8s.io/{held_role}: finalizers ['tessera.dev/test-hold']" in message
    )


def test_objects_are_told_apart_by_uid(cluster: LocalCluster, kube: client.ApiClient) -> None:
    """An object deleted and made again under its name during a turn is the turn's own."""
    rbac = client.RbacAuthorizationV1Api(kube)
    name = unique_name("again")
    rbac.create_cluster_role(client.V1ClusterRole(metadata=client.V1ObjectMeta(name=name)))
    turn = Turn.begin(cluster)
    rbac.delete_cluster_role(name)
    rbac.create_cluster_role(client.V1ClusterRole(metadata=client.V1ObjectMeta(name=name)))
    ref = f"clusterrole.rbac.authorization.k8s.io/{name}"
    assert cluster_scoped_objects(cluster)[ref] != turn.objects[ref]

    turn.end(timeout=60)

    assert not exists(rbac.read_cluster_role, name)
