"""What each of the chart's service accounts may do, asked of the real API server's authorizer
(SubjectAccessReview) after a `helm install`: everything its component uses is allowed, and a list
of what it must never do is denied. Which node's slices and claim statuses the plugin may write is a
matter for the admission policy and the API server, not RBAC: tests/integration/test_node_credentials.py."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest
from kubernetes import client

from tessera.kube import raw_json
from tessera.names import DRIVER_NAME
from testbed.cluster import LocalCluster
from tests.chart_helm import Release, installed

pytestmark = pytest.mark.integration


@dataclass(frozen=True)
class Ask:
    """One request to authorize: verb on resource (group/resource[/subresource]), maybe by name and
    in a namespace."""

    verb: str
    resource: str
    name: str = ""
    namespace: str = ""

    def __str__(self) -> str:
        where = f" in {self.namespace}" if self.namespace else ""
        return f"{self.verb} {self.resource}{'/' + self.name if self.name else ''}{where}"


# Two releases at once: the DeviceClass (one per cluster, the driver's) is left to others.
BASE: dict[str, Any] = {"deviceClass": {"enabled": False}}


@pytest.fixture(scope="module")
def release(
    cluster: LocalCluster, kube: client.ApiClient, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Release]:
    values = {**BASE, "webview": {"enabled": True}}  # optional: on here, so that its account is checked
    with installed(cluster, kube, tmp_path_factory.mktemp("rbac"), values) as release:
        yield release


@pytest.fixture(scope="module")
def own_ca_release(
    cluster: LocalCluster, kube: client.ApiClient, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Release]:
    values = {**BASE, "webhook": {"replicas": 1, "tls": {"source": "self"}}}
    with installed(cluster, kube, tmp_path_factory.mktemp("rbac-self"), values) as release:
        yield release


def allowed(kube: client.ApiClient, release: Release, component: str, ask: Ask, node: str = "") -> bool:
    """The authorizer's answer for ``ask`` by the release's ``component`` account (whose token, with
    ``node``, names that node, as a DaemonSet pod's does)."""
    # "pods", "pods/exec", "resource.k8s.io/resourceclaims/status": a group has a dot.
    parts = ask.resource.split("/")
    group = parts.pop(0) if "." in parts[0] else ""
    resource, subresource = parts[0], (parts[1] if len(parts) > 1 else "")
    attributes = {"verb": ask.verb, "group": group, "resource": resource, "subresource": subresource}
    if ask.name:
        attributes["name"] = ask.name
    if ask.namespace:
        attributes["namespace"] = ask.namespace
    spec: dict[str, Any] = {
        "user": f"system:serviceaccount:{release.namespace}:{release.object_name(component)}",
        "groups": [
            "system:serviceaccounts",
            f"system:serviceaccounts:{release.namespace}",
            "system:authenticated",
        ],
        "resourceAttributes": attributes,
    }
    if node:
        spec["extra"] = {"authentication.kubernetes.io/node-name": [node]}
    review = client.V1SubjectAccessReview.model_validate({"spec": spec})
    response = client.AuthorizationV1Api(kube).create_subject_access_review(review, _preload_content=False)
    return bool(raw_json(response)["status"].get("allowed"))


RESOURCE = "resource.k8s.io"
ANYWHERE = "some-namespace"

PLUGIN_MUST = [
    *(
        Ask(verb, f"{RESOURCE}/resourceslices")
        for verb in ("get", "list", "watch", "create", "update", "delete")
    ),
    *(Ask(verb, f"{RESOURCE}/resourceclaims", namespace=ANYWHERE) for verb in ("get", "list", "watch")),
    Ask("list", f"{RESOURCE}/resourceclaims"),
    Ask("watch", f"{RESOURCE}/resourceclaims"),
    Ask("get", "nodes", name="some-node"),
    # tessera/driver/cordon.py watches its own Node; RBAC cannot narrow a list to it. Read-only, and
    # no more than the node's kubelet credentials (on the host the daemon runs on) already read.
    Ask("list", "nodes"),
    Ask("watch", "nodes"),
    Ask("patch", f"{RESOURCE}/resourceclaims/status", namespace=ANYWHERE),
    Ask("associated-node:patch", f"{RESOURCE}/resourceclaims/driver", name=DRIVER_NAME, namespace=ANYWHERE),
]
PLUGIN_MUST_NOT = [
    # The exporter's, under an account of its own: the plugin reads no pod and writes no Event.
    Ask("list", "pods"),
    Ask("watch", "pods"),
    *(Ask(verb, "events", namespace=ANYWHERE) for verb in ("create", "update", "patch", "delete", "list")),
    Ask("patch", f"{RESOURCE}/resourceslices"),
    Ask("deletecollection", f"{RESOURCE}/resourceslices"),
    *(
        Ask(verb, f"{RESOURCE}/resourceclaims", namespace=ANYWHERE)
        for verb in ("create", "update", "patch", "delete")
    ),
    Ask("update", f"{RESOURCE}/resourceclaims/status", namespace=ANYWHERE),
    # Another node's claims (the API server asks arbitrary-node for a claim not allocated to the
    # token's node) and any claim's allocation: tests/integration/test_node_credentials.py.
    Ask("arbitrary-node:patch", f"{RESOURCE}/resourceclaims/driver", name=DRIVER_NAME, namespace=ANYWHERE),
    *(Ask(verb, f"{RESOURCE}/resourceclaims/binding", namespace=ANYWHERE) for verb in ("update", "patch")),
    Ask(
        "associated-node:patch",
        f"{RESOURCE}/resourceclaims/driver",
        name="gpu.example.com",
        namespace=ANYWHERE,
    ),
    Ask("create", f"{RESOURCE}/resourceclaimtemplates", namespace=ANYWHERE),
    *(Ask(verb, f"{RESOURCE}/deviceclasses") for verb in ("create", "update", "delete")),
    Ask("get", "pods", namespace=ANYWHERE),
    Ask("create", "pods", namespace=ANYWHERE),
    Ask("delete", "pods", namespace=ANYWHERE),
    Ask("create", "pods/exec", namespace=ANYWHERE),
    Ask("update", "nodes", name="some-node"),
    Ask("patch", "nodes", name="some-node"),
    Ask("patch", "nodes/status", name="some-node"),
    # The cordon annotation becomes a taint in the node's own slice, never a DeviceTaintRule, which
    # could taint (and with NoExecute evict from) any device in the cluster.
    *(Ask(verb, f"{RESOURCE}/devicetaintrules") for verb in ("create", "update", "patch", "delete")),
    Ask("get", "secrets", namespace=ANYWHERE),
    Ask("list", "secrets"),
    Ask("list", "configmaps"),
    Ask("create", "serviceaccounts/token", namespace=ANYWHERE),
    Ask("update", "admissionregistration.k8s.io/mutatingwebhookconfigurations"),
    Ask("delete", "admissionregistration.k8s.io/validatingadmissionpolicies"),
    Ask("delete", "admissionregistration.k8s.io/validatingadmissionpolicybindings"),
    Ask("escalate", "rbac.authorization.k8s.io/clusterroles"),
]

EXPORTER_MUST = [
    # tessera/exporter/containers.py: the pods bound to its node (field selector spec.nodeName).
    Ask("list", "pods"),
    Ask("watch", "pods"),
    # tessera/exporter/events.py: an Event on the pod whose process the bypass loop stopped.
    Ask("create", "events", namespace=ANYWHERE),
]
EXPORTER_MUST_NOT = [
    # Events are written once each, never changed, read or removed.
    *(Ask(verb, "events", namespace=ANYWHERE) for verb in ("update", "patch", "delete", "list")),
    Ask("get", "pods", namespace=ANYWHERE),
    Ask("delete", "pods", namespace=ANYWHERE),
    Ask("create", "pods/exec", namespace=ANYWHERE),
    Ask("get", "secrets", namespace=ANYWHERE),
    # The node daemon's objects are the plugin's alone.
    *(Ask(verb, f"{RESOURCE}/resourceslices") for verb in ("list", "create", "update", "delete")),
    *(Ask(verb, f"{RESOURCE}/resourceclaims", namespace=ANYWHERE) for verb in ("get", "list")),
    Ask("patch", f"{RESOURCE}/resourceclaims/status", namespace=ANYWHERE),
    Ask("associated-node:patch", f"{RESOURCE}/resourceclaims/driver", name=DRIVER_NAME, namespace=ANYWHERE),
    Ask("get", "nodes", name="some-node"),
    Ask("patch", "nodes", name="some-node"),
]

WEBHOOK_MUST = [
    Ask("create", f"{RESOURCE}/resourceclaimtemplates", namespace=ANYWHERE),
    # webhook/templates.py: read an existing template to use it only if Tessera wrote it, and watch
    # its own to forget deleted ones (issue 21: planted templates).
    *(
        Ask(verb, f"{RESOURCE}/resourceclaimtemplates", namespace=ANYWHERE)
        for verb in ("get", "list", "watch")
    ),
    Ask("list", f"{RESOURCE}/resourceslices"),
    Ask("watch", f"{RESOURCE}/resourceslices"),
    # webhook/waiting_pods.py: the pods no node is chosen for, and what `kubectl tessera why` reads
    # to judge them; the Event that tells each why, and moving it to now when its reasons return.
    Ask("list", "pods"),
    Ask("list", "nodes"),
    Ask("list", f"{RESOURCE}/resourceclaims"),
    Ask("list", f"{RESOURCE}/devicetaintrules"),
    Ask("create", "events", namespace=ANYWHERE),
    Ask("patch", "events", namespace=ANYWHERE),
]
WEBHOOK_MUST_NOT = [
    # The anchor's trap: the webhook never makes claims itself (templates let Kubernetes own them).
    *(Ask(verb, f"{RESOURCE}/resourceclaims", namespace=ANYWHERE) for verb in ("create", "get", "delete")),
    *(
        Ask(verb, f"{RESOURCE}/resourceclaimtemplates", namespace=ANYWHERE)
        for verb in ("update", "patch", "delete")
    ),
    *(Ask(verb, f"{RESOURCE}/resourceslices") for verb in ("create", "update", "delete")),
    Ask("create", f"{RESOURCE}/deviceclasses"),
    Ask("create", "pods", namespace=ANYWHERE),
    Ask("patch", "pods", namespace=ANYWHERE),
    Ask("get", "secrets", namespace=ANYWHERE),
    # Reading waiting pods and nodes is all: no watch, no single reads, nothing written to them.
    Ask("watch", "pods"),
    Ask("get", "pods", namespace=ANYWHERE),
    Ask("patch", "nodes", name="some-node"),
    Ask("watch", "nodes"),
    *(Ask(verb, "events", namespace=ANYWHERE) for verb in ("update", "delete", "list")),
    Ask("create", "admissionregistration.k8s.io/mutatingwebhookconfigurations"),
    Ask("update", "admissionregistration.k8s.io/validatingwebhookconfigurations", name="anything"),
]


WEBVIEW_MUST = [
    Ask("list", f"{RESOURCE}/resourceslices"),
    Ask("list", f"{RESOURCE}/devicetaintrules"),
    Ask("list", f"{RESOURCE}/resourceclaims"),
    Ask("list", f"{RESOURCE}/resourceclaimtemplates"),
    Ask("list", "nodes"),
    Ask("list", "pods"),
]
WEBVIEW_MUST_NOT = [
    # Lists only: not a watch, not one object by name, and nothing beyond the six kinds.
    *(Ask("watch", ask.resource) for ask in WEBVIEW_MUST),
    Ask("get", "pods", namespace=ANYWHERE),
    Ask("get", "nodes", name="some-node"),
    *(Ask(verb, "secrets", namespace=ANYWHERE) for verb in ("get", "list")),
    Ask("list", "secrets"),
    Ask("list", "configmaps"),
    Ask("list", "events"),
    Ask("list", "kueue.x-k8s.io/workloads"),
    # Nothing through a pod, and no write anywhere.
    Ask("get", "pods/proxy", namespace=ANYWHERE),
    Ask("get", "pods/log", namespace=ANYWHERE),
    Ask("create", "pods/exec", namespace=ANYWHERE),
    Ask("create", "pods/portforward", namespace=ANYWHERE),
    *(Ask(verb, "pods", namespace=ANYWHERE) for verb in ("create", "update", "patch", "delete")),
    Ask("create", "events", namespace=ANYWHERE),
    *(Ask(verb, f"{RESOURCE}/resourceclaims", namespace=ANYWHERE) for verb in ("create", "patch", "delete")),
    Ask("patch", f"{RESOURCE}/resourceslices"),
    Ask("patch", "nodes", name="some-node"),
]


def failures(
    kube: client.ApiClient, release: Release, component: str, asks: list[Ask], expected: bool, node: str = ""
) -> list[str]:
    return [str(a) for a in asks if allowed(kube, release, component, a, node) != expected]


def test_the_kubelet_plugin_may_do_what_the_driver_needs(kube: client.ApiClient, release: Release) -> None:
    assert failures(kube, release, "kubeletplugin", PLUGIN_MUST, True, node="some-node") == []


def test_the_kubelet_plugin_may_do_nothing_else(kube: client.ApiClient, release: Release) -> None:
    assert failures(kube, release, "kubeletplugin", PLUGIN_MUST_NOT, False, node="some-node") == []


def test_the_exporter_may_do_what_it_needs_and_nothing_else(kube: client.ApiClient, release: Release) -> None:
    assert failures(kube, release, "exporter", EXPORTER_MUST, True, node="some-node") == []
    assert failures(kube, release, "exporter", EXPORTER_MUST_NOT, False, node="some-node") == []


def test_the_web_view_may_list_what_its_page_shows_and_do_nothing_else(
    kube: client.ApiClient, release: Release
) -> None:
    assert failures(kube, release, "webview", WEBVIEW_MUST, True) == []
    assert failures(kube, release, "webview", WEBVIEW_MUST_NOT, False) == []


def test_the_webhook_may_do_what_it_needs(kube: client.ApiClient, release: Release) -> None:
    assert failures(kube, release, "webhook", WEBHOOK_MUST, True) == []


def test_the_webhook_may_keep_its_own_secrets_and_configuration_and_do_nothing_else(
    kube: client.ApiClient, release: Release
) -> None:
    """By default the webhook keeps its certificates itself (webhook.tls.source secret, clientAuth
    without a CA): its two Secrets in the release namespace and its configuration's caBundle."""
    configuration = f"{release.name}-webhook"
    group = "admissionregistration.k8s.io/mutatingwebhookconfigurations"
    here = release.namespace
    kept = [f"{release.name}-webhook-shared-tls", f"{release.name}-webhook-apiserver-client"]
    may = [Ask("get", group, configuration), Ask("update", group, configuration)]
    may += [Ask(verb, "secrets", name=name, namespace=here) for name in kept for verb in ("get", "update")]
    may += [Ask("create", "secrets", namespace=here)]
    assert failures(kube, release, "webhook", may, True) == []
    never = [
        *(Ask(verb, "secrets", name="someone-elses", namespace=here) for verb in ("get", "update", "delete")),
        Ask("delete", "secrets", name=kept[0], namespace=here),
        Ask("list", "secrets", namespace=here),
        Ask("watch", "secrets", namespace=here),
        Ask("create", "secrets", namespace=ANYWHERE),
        Ask("get", "secrets", name=kept[0], namespace=ANYWHERE),
        Ask("update", group, name="someone-elses"),
    ]
    assert failures(kube, release, "webhook", WEBHOOK_MUST_NOT + never, False) == []


def test_a_webhook_keeping_its_own_ca_may_update_only_its_own_configuration(
    kube: client.ApiClient, own_ca_release: Release
) -> None:
    own = f"{own_ca_release.name}-webhook"
    group = "admissionregistration.k8s.io/mutatingwebhookconfigurations"
    assert (
        failures(kube, own_ca_release, "webhook", [Ask("get", group, own), Ask("update", group, own)], True)
        == []
    )
    others = [
        Ask("update", group, name="someone-elses"),
        Ask("delete", group, name=own),
        Ask("list", group),
        Ask("create", group),
    ]
    assert failures(kube, own_ca_release, "webhook", others + WEBHOOK_MUST_NOT, False) == []
