"""Issue 21's attacks on the webhook, against the real API server with its client certificate on:
forged reviews posted straight to the webhook (no certificate, another name, another namespace),
templates planted under the name the webhook would use (before it writes one, and after it
verified one), hostile quantities through the API server, and a flood of slow connections and huge
bodies while the API server keeps having real pods admitted.

The webhook runs in this process (webhook_bed.RunningWebhook), answering only the test bed API
server's webhook client certificate (testbed/cluster.py), as the chart installs it.
"""

from __future__ import annotations

import http.client
import json
import ssl
from collections.abc import Iterator
from typing import Any

import pytest
from kubernetes import client
from kubernetes.client import ApiException

from tessera.gpu_request import container_requests
from tessera.kube import raw_json
from tessera.names import HAMI_GPUCORES, HAMI_GPUMEM
from tessera.quantity import GiB
from tessera.webhook.conversion import claim_template
from tessera.webhook.fleet import Fleet
from tessera.webhook.templates import TemplateStore
from testbed.cluster import LocalCluster
from testbed.driver_node import DriverNode, ensure_device_class
from testbed.fake_nodes import create_ready_node
from testbed.names import unique_name
from testbed.pki import KeyPair
from testbed.polling import poll_until
from tests.integration.webhook_bed import RunningWebhook
from tests.webhook_clients import answer_of, client_context, handshake_refused, tls_socket

pytestmark = pytest.mark.integration

GPU = {HAMI_GPUMEM: "8000", HAMI_GPUCORES: "30"}


@pytest.fixture(scope="module")
def webhook(cluster: LocalCluster, kube: client.ApiClient) -> Iterator[RunningWebhook]:
    ensure_device_class(kube)
    name = unique_name("node")
    create_ready_node(kube, name, None)
    node = DriverNode(cluster, name, gpus=2, memory_bytes=80 * GiB)
    node.start()
    node.wait_published()
    running = RunningWebhook(kube, cluster)
    try:
        poll_until(lambda: running.cache.fleet == Fleet((80 * GiB,), 2), 30, "the webhook's cache")
        yield running
    finally:
        running.stop()
        node.cleanup()
        client.CoreV1Api(kube).delete_node(name)


@pytest.fixture
def ns(webhook: RunningWebhook, namespace: str) -> str:
    webhook.wait_effective(namespace)
    return namespace


def gpu_pod(name: str, limits: dict[str, str]) -> dict[str, Any]:
    return {
        "metadata": {"name": name},
        "spec": {"containers": [{"name": "main", "image": "x", "resources": {"limits": dict(limits)}}]},
    }


def create_pod(kube: client.ApiClient, namespace: str, pod: dict[str, Any], **kwargs: Any) -> dict[str, Any]:
    return raw_json(
        client.CoreV1Api(kube).create_namespaced_pod(
            namespace, client.V1Pod.model_validate(pod), _preload_content=False, **kwargs
        )
    )


def refusal(kube: client.ApiClient, namespace: str, pod: dict[str, Any], **kwargs: Any) -> str:
    """The API server's message refusing ``pod`` (the test fails if it is admitted)."""
    with pytest.raises(ApiException) as refused:
        create_pod(kube, namespace, pod, **kwargs)
    message: str = json.loads(refused.value.body or "{}")["message"]
    return message


def all_templates(kube: client.ApiClient) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = raw_json(
        client.ResourceV1Api(kube).list_resource_claim_template_for_all_namespaces(_preload_content=False)
    )["items"]
    return items


def the_webhooks_template(webhook: RunningWebhook, namespace: str, limits: dict[str, str]) -> dict[str, Any]:
    """The template the webhook writes for a pod with ``limits`` in ``namespace``."""
    ((_, _, _, where, request),) = container_requests(gpu_pod("p", limits)["spec"])
    return claim_template(namespace, where, request, webhook.cache.fleet)


def forged_review(namespace: str, pod_namespace: str | None = None) -> bytes:
    pod = {**gpu_pod("forged", {HAMI_GPUMEM: "80000"}), "apiVersion": "v1", "kind": "Pod"}
    pod["metadata"]["namespace"] = pod_namespace or namespace
    review = {
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": "f0f0f0f0-0000-4000-8000-000000000001",
            "kind": {"group": "", "version": "v1", "kind": "Pod"},
            "operation": "CREATE",
            "namespace": namespace,
            "userInfo": {"username": "system:anonymous"},
            "object": pod,
        },
    }
    return json.dumps(review).encode()


def post(webhook: RunningWebhook, body: bytes, client_pair: KeyPair | None) -> tuple[int, str]:
    connection = http.client.HTTPSConnection(
        "127.0.0.1",
        webhook.server.port,
        context=client_context(webhook.certificates, client_pair),
        timeout=30,
    )
    connection.request("POST", "/mutate", body, {"Content-Type": "application/json"})
    response = connection.getresponse()
    return response.status, response.read().decode()


# ---------------------------------------------------------------------------------------------------
# Forged reviews


def test_a_forged_review_without_a_certificate_fails_the_handshake_and_nothing_is_created_anywhere(
    webhook: RunningWebhook, kube: client.ApiClient, ns: str
) -> None:
    before = all_templates(kube)
    assert handshake_refused(webhook.server.port, client_context(webhook.certificates, None))
    for target in (ns, "kube-system", "default"):
        with pytest.raises((ssl.SSLError, ConnectionError)):
            post(webhook, forged_review(target), None)
    assert all_templates(kube) == before


def test_a_certificate_of_another_name_gets_403_and_nothing_is_created(
    webhook: RunningWebhook, kube: client.ApiClient, cluster: LocalCluster, ns: str
) -> None:
    assert cluster.webhook_client_ca is not None
    tenant = cluster.webhook_client_ca.issue(
        unique_name("tenant"), common_name="system:anonymous", client=True
    )
    before = all_templates(kube)
    status, text = post(webhook, forged_review("kube-system"), tenant)
    assert (status, text) == (
        403,
        'client certificate "system:anonymous" is not allowed to post reviews '
        "(allowed: kube-apiserver-webhook-client).",
    )
    assert all_templates(kube) == before


def test_a_review_whose_namespace_is_not_its_pods_is_refused_even_from_the_api_servers_certificate(
    webhook: RunningWebhook, kube: client.ApiClient, cluster: LocalCluster, ns: str
) -> None:
    before = all_templates(kube)
    status, text = post(webhook, forged_review("kube-system", pod_namespace=ns), cluster.webhook_client)
    assert (status, text) == (
        400,
        f'the review\'s namespace "kube-system" is not its pod\'s namespace "{ns}".',
    )
    assert all_templates(kube) == before


def test_the_api_server_with_its_certificate_has_gpu_pods_converted(
    webhook: RunningWebhook, kube: client.ApiClient, ns: str
) -> None:
    created = create_pod(kube, ns, gpu_pod("converted", GPU))
    [claim] = created["spec"]["resourceClaims"]
    assert claim["resourceClaimTemplateName"] == the_webhooks_template(webhook, ns, GPU)["metadata"]["name"]


# ---------------------------------------------------------------------------------------------------
# Planted templates


def plant(kube: client.ApiClient, template: dict[str, Any]) -> None:
    client.ResourceV1Api(kube).create_namespaced_resource_claim_template(
        template["metadata"]["namespace"], client.V1ResourceClaimTemplate.model_validate(template)
    )


def test_a_planted_template_without_the_label_is_not_used_and_the_pod_is_denied_naming_it(
    webhook: RunningWebhook, kube: client.ApiClient, ns: str
) -> None:
    template = the_webhooks_template(webhook, ns, GPU)
    planted = {**template, "metadata": {k: v for k, v in template["metadata"].items() if k != "labels"}}
    plant(kube, planted)
    message = refusal(kube, ns, gpu_pod("victim", GPU))
    name = template["metadata"]["name"]
    assert (
        f"ResourceClaimTemplate {ns}/{name} already exists without the label "
        "app.kubernetes.io/managed-by=tessera-webhook, so Tessera did not make it and will not use it; "
        "delete it and create the pod again." in message
    )


def test_a_planted_labelled_template_with_a_bigger_spec_is_not_used(
    webhook: RunningWebhook, kube: client.ApiClient, ns: str
) -> None:
    template = the_webhooks_template(webhook, ns, GPU)
    bigger = json.loads(json.dumps(template))
    bigger["spec"]["spec"]["devices"]["requests"][0]["exactly"]["capacity"]["requests"]["memory"] = "80Gi"
    plant(kube, bigger)
    message = refusal(kube, ns, gpu_pod("victim", GPU))
    assert (
        f"ResourceClaimTemplate {ns}/{template['metadata']['name']} already exists with a spec other than"
        in message
    )
    resource = client.ResourceV1Api(kube)
    resource.delete_namespaced_resource_claim_template(template["metadata"]["name"], ns)
    created = create_pod(kube, ns, gpu_pod("after", GPU))  # the webhook now writes its own
    assert created["spec"]["resourceClaims"][0]["resourceClaimTemplateName"] == template["metadata"]["name"]
    stored = raw_json(
        resource.read_namespaced_resource_claim_template(
            template["metadata"]["name"], ns, _preload_content=False
        )
    )
    assert (
        stored["spec"]["spec"]["devices"]["requests"][0]["exactly"]["capacity"]["requests"]["memory"]
        == "8000Mi"
    )


def test_a_template_replanted_after_the_webhook_verified_it_is_not_used(
    webhook: RunningWebhook, kube: client.ApiClient, ns: str
) -> None:
    """The webhook remembers a verified template for 300 s; deleting it and planting a bigger one
    under the same name must not ride on that memory: the watch forgets the deleted object."""
    template = the_webhooks_template(webhook, ns, GPU)
    name = template["metadata"]["name"]
    create_pod(kube, ns, gpu_pod("first", GPU))  # the webhook writes and remembers the template
    resource = client.ResourceV1Api(kube)
    resource.delete_namespaced_resource_claim_template(name, ns)
    bigger = json.loads(json.dumps(template))
    bigger["spec"]["spec"]["devices"]["requests"][0]["exactly"]["capacity"]["requests"]["memory"] = "80Gi"
    plant(kube, bigger)
    attempts = iter(range(1000))

    def denied() -> str | None:
        try:
            create_pod(kube, ns, gpu_pod(f"next-{next(attempts)}", GPU))
        except ApiException as error:
            return str(json.loads(error.body or "{}")["message"])
        return None

    message = poll_until(denied, 60, "a pod denied for the replanted template (the TTL is 300 s)")
    assert f"ResourceClaimTemplate {ns}/{name} already exists with a spec other than" in message


def test_a_second_replica_uses_the_template_the_first_wrote(
    webhook: RunningWebhook, kube: client.ApiClient, ns: str
) -> None:
    """Two stores (two replicas) and a spec the API writes back differently (81920Mi as 80Gi): the
    second replica meets AlreadyExists, reads the template, finds it its own and the same."""
    template = the_webhooks_template(webhook, ns, {"nvidia.com/gpumem-percentage": "100"})
    assert TemplateStore(webhook.api).ensure(template) is True
    [made] = [t for t in all_templates(kube) if t["metadata"]["namespace"] == ns]
    assert "80Gi" in json.dumps(made["spec"])
    assert TemplateStore(webhook.api).ensure(template) is True
    [still] = [t for t in all_templates(kube) if t["metadata"]["namespace"] == ns]
    assert still["metadata"]["uid"] == made["metadata"]["uid"]


# ---------------------------------------------------------------------------------------------------
# Bounded input, through the API server and straight at the webhook


@pytest.mark.parametrize("value", ["1e1000000", "1e5000"])
def test_hostile_quantities_are_denied_through_the_api_server_with_a_short_sentence(
    webhook: RunningWebhook, kube: client.ApiClient, ns: str, value: str
) -> None:
    message = refusal(kube, ns, gpu_pod("huge", {HAMI_GPUMEM: value}), dry_run="All")
    assert 'container "main": nvidia.com/gpumem is refused: quantity "' in message
    assert len(message) < 400


def test_infinity_never_reaches_the_webhook_the_api_server_refuses_it(
    webhook: RunningWebhook, kube: client.ApiClient, ns: str
) -> None:
    reviews = sum(
        webhook.reviews(o) for o in ("ignored", "untouched", "converted", "denied", "malformed", "error")
    )
    message = refusal(kube, ns, gpu_pod("infinite", {HAMI_GPUMEM: "Infinity"}), dry_run="All")
    assert "quantities must match the regular expression" in message
    assert (
        sum(webhook.reviews(o) for o in ("ignored", "untouched", "converted", "denied", "malformed", "error"))
        == reviews
    )


def test_slow_connections_and_huge_bodies_do_not_stop_the_api_servers_reviews(
    webhook: RunningWebhook, kube: client.ApiClient, cluster: LocalCluster, ns: str
) -> None:
    """200 connections stalled in their heads (past the handshake, so with the API server's
    certificate) and a 10 MB body, all open while the API server has a GPU pod
    reviewed: the pod is converted, each stalled connection gets 408, the body is answered 413 from
    its head alone, and a caller without a certificate is refused in the handshake."""
    anyone = client_context(webhook.certificates, cluster.webhook_client)
    slow = []
    for index in range(200):
        connection = tls_socket(webhook.server.port, anyone)
        connection.sendall(
            b"POST /mutate HTTP/1.1\r\n" if index % 2 else b"POST /mutate HTTP/1.1\r\nContent-Len"
        )
        slow.append(connection)
    huge = tls_socket(webhook.server.port, client_context(webhook.certificates, cluster.webhook_client))
    huge.sendall(
        b"POST /mutate HTTP/1.1\r\nContent-Type: application/json\r\nContent-Length: 10485760\r\n\r\n"
    )
    created = create_pod(kube, ns, gpu_pod("during", GPU), dry_run="All")
    assert created["spec"]["resourceClaims"][0]["name"] == "tessera-main"
    assert handshake_refused(webhook.server.port, client_context(webhook.certificates, None))
    assert answer_of(huge).startswith(b"HTTP/1.1 413 ")
    for connection in slow:
        assert answer_of(connection).startswith(b"HTTP/1.1 408 ")
