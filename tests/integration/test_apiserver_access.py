"""The test bed's MutatingAdmissionPolicy tells the pods of labelled namespaces where the API server
is (their node's address and its port), leaves other namespaces' pods alone, and keeps what a
container's own env already says; the API server's certificate names every node address."""

from __future__ import annotations

import socket
import ssl
from collections.abc import Iterator
from typing import Any

import pytest
from kubernetes import client

from tessera.kube import raw_json
from testbed.apiserver_access import LABEL, let_pods_reach_apiserver, wait_effective
from testbed.cluster import LocalCluster
from testbed.names import unique_name
from testbed.node_host import node_addresses

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def labelled(kube: client.ApiClient, cluster: LocalCluster) -> Iterator[str]:
    let_pods_reach_apiserver(kube, cluster)
    name = unique_name("reach")
    core = client.CoreV1Api(kube)
    core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=name, labels={LABEL: "true"})))
    wait_effective(kube, name)
    yield name
    core.delete_namespace(name)


def dry_run_pod(kube: client.ApiClient, namespace: str, containers: list[dict[str, Any]]) -> dict[str, Any]:
    body = client.V1Pod.model_validate({"metadata": {"name": "p"}, "spec": {"containers": containers}})
    core = client.CoreV1Api(kube)
    return raw_json(core.create_namespaced_pod(namespace, body, dry_run="All", _preload_content=False))


def test_every_container_of_a_labelled_namespaces_pod_is_told_the_node_address_and_port(
    kube: client.ApiClient, cluster: LocalCluster, labelled: str
) -> None:
    pod = dry_run_pod(
        kube,
        labelled,
        [{"name": "a", "image": "x", "env": [{"name": "OWN", "value": "1"}]}, {"name": "b", "image": "x"}],
    )
    for container in pod["spec"]["containers"]:
        env = {e["name"]: e for e in container["env"]}
        assert env["KUBERNETES_SERVICE_HOST"]["valueFrom"]["fieldRef"]["fieldPath"] == "status.hostIP"
        assert env["KUBERNETES_SERVICE_PORT"]["value"] == str(cluster.api_port)
    assert {"name": "OWN", "value": "1"} in pod["spec"]["containers"][0]["env"]


def test_pods_of_other_namespaces_are_left_alone(
    kube: client.ApiClient, labelled: str, namespace: str
) -> None:
    pod = dry_run_pod(kube, namespace, [{"name": "a", "image": "x"}])
    assert "env" not in pod["spec"]["containers"][0]


def test_the_api_servers_certificate_names_every_node_address(cluster: LocalCluster) -> None:
    """A node's address is the machine's only while a node holds its bridge, so the certificate is
    checked here over loopback: it names every address a node can have (pods on real nodes call
    the API server at theirs in tests/e2e/test_chart_node.py)."""
    assert cluster.ca is not None
    context = ssl.create_default_context(cafile=str(cluster.ca.pair.cert))
    with (
        socket.create_connection(("127.0.0.1", cluster.api_port), timeout=10) as raw,
        context.wrap_socket(raw, server_hostname="127.0.0.1") as tls,
    ):
        certificate = tls.getpeercert()
    assert certificate is not None
    alternative_names: tuple[tuple[str, str], ...] = certificate["subjectAltName"]  # type: ignore[assignment]
    names = {value for kind, value in alternative_names if kind == "IP Address"}
    assert set(node_addresses()) <= names
