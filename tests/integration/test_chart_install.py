"""charts/tessera installed into the local control plane: the real API server accepts every object,
an upgrade keeps the webhook's CA, and an uninstall leaves nothing of the release behind.

No node runs the pods here (tests/e2e does that); this is the chart's contract with the API server.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client

from tessera.kube import raw_json
from tessera.names import DEVICE_CLASS
from testbed.chart_bed import device_class_left_to_the_chart, node_layout_values
from testbed.cluster import LocalCluster
from testbed.kubectl import kubectl
from testbed.names import unique_name
from testbed.polling import poll_until
from tests.chart_helm import CHART, HelmError, helm, render, values_file

pytestmark = pytest.mark.integration

NODE_ROOT = "/tmp/tessera-nodes"
VALUE_SETS: dict[str, dict[str, Any]] = {
    # What a user gets, plus the dashboard (the Prometheus Operator's kinds need its CRDs).
    "defaults": {"exporter": {"dashboard": {"enabled": True}}},
    # The test bed's shape: per-node folders under one host folder, the simulated driver mounted by
    # the daemon itself, the host network, and the webhook keeping its own CA.
    "test-bed": {
        "kubeletPlugin": {
            **node_layout_values(NODE_ROOT, f"{NODE_ROOT}/$(NODE_NAME)/driver/lib"),
            "nodeSelector": {"tessera.dev/test-bed": "true"},
        },
        "webhook": {"replicas": 1, "tls": {"source": "self"}},
    },
}


# For releases beside others: the DeviceClass exists once per cluster.
NO_CLUSTER_SINGLETONS: dict[str, Any] = {"deviceClass": {"enabled": False}}
OWN_CA: dict[str, Any] = {"webhook": {"replicas": 1, "tls": {"source": "self"}}}


@pytest.fixture
def device_class_free(kube: client.ApiClient) -> Iterator[None]:
    """The chart owns the DeviceClass gpu.tessera.dev, which other tests make without Helm: theirs
    is taken away for the install and put back afterwards."""
    with device_class_left_to_the_chart(kube):
        yield


def manifest_objects(cluster: LocalCluster, home: Path, release: str, namespace: str) -> list[dict[str, Any]]:
    result = helm(home, "get", "manifest", release, "-n", namespace, kubeconfig=cluster.admin_kubeconfig)
    return [o for o in yaml.safe_load_all(result.stdout) if o]


def labelled(cluster: LocalCluster, release: str) -> set[str]:
    """Every object of every listable kind, in any namespace, that carries the release's label, as
    kubectl's "kind.group/name" (namespace-blind: names are unique within the release)."""
    kinds = kubectl(cluster.admin_kubeconfig, "api-resources", "--verbs=list", "-o", "name").split()
    listed = kubectl(
        cluster.admin_kubeconfig,
        "get",
        ",".join(kinds),
        "--all-namespaces",
        "--ignore-not-found",
        "-l",
        f"app.kubernetes.io/instance={release}",
        "-o",
        "name",
        timeout=120,
    )
    return set(listed.split())


def kubectl_name(obj: dict[str, Any]) -> str:
    """The "kind.group/name" kubectl prints for ``obj`` (core kinds have no group)."""
    group = obj["apiVersion"].rpartition("/")[0]
    kind = obj["kind"].lower()
    return f"{kind}.{group}/{obj['metadata']['name']}" if group else f"{kind}/{obj['metadata']['name']}"


def read_back(cluster: LocalCluster, obj: dict[str, Any], namespace: str) -> dict[str, Any] | None:
    """``obj`` as the API server holds it, or None if it has no such object."""
    args = ["get", kubectl_name(obj), "--ignore-not-found", "-o", "json"]
    if obj["metadata"].get("namespace") or obj["kind"] not in CLUSTER_SCOPED:
        args += ["-n", obj["metadata"].get("namespace", namespace)]
    text = kubectl(cluster.admin_kubeconfig, *args)
    return json.loads(text) if text.strip() else None


CLUSTER_SCOPED = {
    "ClusterRole",
    "ClusterRoleBinding",
    "DeviceClass",
    "MutatingWebhookConfiguration",
    "ValidatingAdmissionPolicy",
    "ValidatingAdmissionPolicyBinding",
    "Namespace",
}


@pytest.mark.parametrize("values", list(VALUE_SETS.values()), ids=list(VALUE_SETS))
def test_install_creates_every_object_and_uninstall_leaves_nothing(
    cluster: LocalCluster,
    kube: client.ApiClient,
    namespace: str,
    tmp_path: Path,
    device_class_free: None,
    values: dict[str, Any],
) -> None:
    release = unique_name("tessera")
    installed = False
    try:
        helm(
            tmp_path,
            "install",
            release,
            str(CHART),
            "-n",
            namespace,
            "-f",
            str(values_file(tmp_path, values)),
            kubeconfig=cluster.admin_kubeconfig,
        )
        installed = True
        objects = manifest_objects(cluster, tmp_path, release, namespace)
        kinds = {o["kind"] for o in objects}
        assert kinds >= {
            "DaemonSet",
            "Deployment",
            "DeviceClass",
            "MutatingWebhookConfiguration",
            "ValidatingAdmissionPolicy",
            "ValidatingAdmissionPolicyBinding",
            "ClusterRole",
            "ClusterRoleBinding",
            "ServiceAccount",
            "Service",
            "PodDisruptionBudget",
        }
        for obj in objects:
            assert read_back(cluster, obj, namespace) is not None, f"{kubectl_name(obj)} was not created"
        # Every object of the release carries its label, so the listing below can find leftovers.
        names = {kubectl_name(o) for o in objects}
        assert names <= labelled(cluster, release)
        # The real API server took the DeviceClass as the driver's.
        device_class = raw_json(
            client.ResourceV1Api(kube).read_device_class(DEVICE_CLASS, _preload_content=False)
        )
        assert device_class["metadata"]["labels"]["app.kubernetes.io/instance"] == release
        # NOTES.txt tells the user how to check the install and run a first workload.
        notes = helm(tmp_path, "get", "notes", release, "-n", namespace, kubeconfig=cluster.admin_kubeconfig)
        assert f"rollout status daemonset/{release}-kubeletplugin" in notes.stdout
        assert f"rollout status daemonset/{release}-exporter" in notes.stdout
        assert f"helm test {release} -n {namespace}" in notes.stdout
        assert "nvidia.com/gpumem: 8000" in notes.stdout
    finally:
        if installed:
            helm(
                tmp_path, "uninstall", release, "-n", namespace, "--wait", kubeconfig=cluster.admin_kubeconfig
            )
    # Controllers' objects (ReplicaSets, pods, endpoint slices) go by garbage collection, shortly after.
    left: set[str] = set()

    def nothing_left() -> bool:
        left.clear()
        left.update(labelled(cluster, release))
        return not left

    poll_until(nothing_left, 120, f"no object labelled with release {release}")
    for obj in objects:
        assert read_back(cluster, obj, namespace) is None, f"{kubectl_name(obj)} outlived the uninstall"


def test_an_upgrade_with_changed_values_rolls_the_daemonset_and_keeps_the_webhooks_ca(
    cluster: LocalCluster, kube: client.ApiClient, namespace: str, tmp_path: Path, device_class_free: None
) -> None:
    release = unique_name("tessera")
    apps = client.AppsV1Api(kube)
    admission = client.AdmissionregistrationV1Api(kube)
    name = release  # it contains "tessera", so objects are named "<release>-<component>"
    common = ["-n", namespace]

    def daemonset() -> dict[str, Any]:
        return raw_json(
            apps.read_namespaced_daemon_set(f"{name}-kubeletplugin", namespace, _preload_content=False)
        )

    def webhook_pod_template() -> dict[str, Any]:
        deployment = raw_json(
            apps.read_namespaced_deployment(f"{name}-webhook", namespace, _preload_content=False)
        )
        template: dict[str, Any] = deployment["spec"]["template"]
        return template

    def ca_bundle() -> str:
        configuration = raw_json(
            admission.read_mutating_webhook_configuration(f"{name}-webhook", _preload_content=False)
        )
        return str(configuration["webhooks"][0]["clientConfig"]["caBundle"])

    # The chart-made CA (webhook.tls.source chart) is the one an upgrade could replace; the default
    # (secret) renders none, and the next test shows its caBundle kept.
    chart_ca = ["--set", "webhook.tls.source=chart"]
    helm(tmp_path, "install", release, str(CHART), *common, *chart_ca, kubeconfig=cluster.admin_kubeconfig)
    try:
        before, bundle, webhook_before = daemonset(), ca_bundle(), webhook_pod_template()
        assert bundle
        helm(
            tmp_path,
            "upgrade",
            release,
            str(CHART),
            *common,
            *chart_ca,
            "--set",
            "kubeletPlugin.logLevel=debug",
            kubeconfig=cluster.admin_kubeconfig,
        )
        after = daemonset()
        assert after["metadata"]["generation"] > before["metadata"]["generation"]
        assert "--log-level=debug" in after["spec"]["template"]["spec"]["containers"][0]["args"]
        # New pod first, old pod after: the node's plugin stays registered throughout.
        assert after["spec"]["updateStrategy"]["rollingUpdate"] == {"maxSurge": 1, "maxUnavailable": 0}
        assert ca_bundle() == bundle, "the upgrade replaced the CA the API server trusts"
        # Nothing of the webhook's changed, so its pods must not roll (their certificate included).
        assert webhook_pod_template() == webhook_before
    finally:
        helm(tmp_path, "uninstall", release, *common, "--wait", kubeconfig=cluster.admin_kubeconfig)


@pytest.mark.parametrize("own", [{}, OWN_CA], ids=["secret", "self"])
def test_an_upgrade_leaves_the_caBundle_the_webhook_keeps_itself(
    cluster: LocalCluster, kube: client.ApiClient, namespace: str, tmp_path: Path, own: dict[str, Any]
) -> None:
    """With webhook.tls.source secret (the default) or self the webhook writes caBundle; Helm's
    three-way merge must keep it."""
    release = unique_name("tessera")
    admission = client.AdmissionregistrationV1Api(kube)
    configuration = f"{release}-webhook"
    values = ["-n", namespace, "-f", str(values_file(tmp_path, {**NO_CLUSTER_SINGLETONS, **own}))]
    helm(tmp_path, "install", release, str(CHART), *values, kubeconfig=cluster.admin_kubeconfig)
    try:
        written = "LS0tLS1CRUdJTiBDRVJUSUZJQ0FURS0tLS0t"  # what the webhook would write (any bytes do)
        patch = {"webhooks": [{"name": "pods.gpu.tessera.dev", "clientConfig": {"caBundle": written}}]}
        admission.patch_mutating_webhook_configuration(configuration, patch)
        helm(
            tmp_path,
            "upgrade",
            release,
            str(CHART),
            *values,
            "--set",
            "webhook.logLevel=debug",
            kubeconfig=cluster.admin_kubeconfig,
        )
        body = raw_json(admission.read_mutating_webhook_configuration(configuration, _preload_content=False))
        assert body["webhooks"][0]["clientConfig"]["caBundle"] == written
    finally:
        helm(tmp_path, "uninstall", release, "-n", namespace, "--wait", kubeconfig=cluster.admin_kubeconfig)


# Every way the values widen the policies at once: CIDRs of both families, scrapers by selectors and
# by address, and extra rules on each component (the admission check's needs Kueue's API to render).
WIDENED: dict[str, Any] = {
    "queue": {"admissionCheck": {"enabled": True}},
    "networkPolicy": {
        "scrapers": [
            {
                "namespaceSelector": {
                    "matchExpressions": [{"key": "team", "operator": "In", "values": ["obs"]}]
                },
                "podSelector": {"matchLabels": {"app": "prometheus"}},
            },
            {"ipBlock": {"cidr": "192.0.2.0/24", "except": ["192.0.2.128/25"]}},
        ],
        "webhook": {
            "apiServerCIDRs": ["10.96.0.0/16", "fd00:10::/64"],
            "extraIngress": [{"from": [{"podSelector": {}}], "ports": [{"port": 8080, "protocol": "TCP"}]}],
        },
        "exporter": {"extraIngress": [{"from": [{"ipBlock": {"cidr": "198.51.100.0/24"}}]}]},
        "admissionCheck": {"extraIngress": [{"ports": [{"port": 8081, "endPort": 8082, "protocol": "TCP"}]}]},
    },
}


@pytest.mark.parametrize("values", [{}, WIDENED], ids=["defaults", "widened"])
def test_the_api_server_accepts_every_network_policy_as_rendered(
    kube: client.ApiClient, namespace: str, tmp_path: Path, values: dict[str, Any]
) -> None:
    """The test bed's CNI (the bridge plugin) enforces no NetworkPolicy, so what can be proven here is
    that the real API server validates each policy the chart renders and stores it unchanged
    (a server-side dry run); enforcement is the cluster's CNI's (docs/install.md)."""
    objects = render(
        tmp_path, values, namespace=namespace, extra=("--api-versions", "kueue.x-k8s.io/v1beta2")
    )
    policies = [o for o in objects if o["kind"] == "NetworkPolicy"]
    assert {p["metadata"]["name"] for p in policies} == {
        "tessera-webhook",
        "tessera-kubeletplugin",
        "tessera-exporter",
        *(["tessera-admissioncheck"] if values else []),
    }
    networking = client.NetworkingV1Api(kube)
    for policy in policies:
        stored = raw_json(
            networking.create_namespaced_network_policy(
                namespace,
                client.V1NetworkPolicy.model_validate(policy),
                dry_run="All",
                _preload_content=False,
            )
        )
        assert stored["spec"] == policy["spec"], policy["metadata"]["name"]
    assert networking.list_namespaced_network_policy(namespace).items == [], "a dry run stored something"


def test_a_release_with_the_old_node_port_upgrades_once_its_service_is_deleted(
    cluster: LocalCluster, kube: client.ApiClient, namespace: str, tmp_path: Path
) -> None:
    """docs/install.md, Upgrades: the exporter Service cannot turn headless in place (a Service keeps
    its virtual IP); deleted first, the upgrade makes it again, headless."""
    release = unique_name("tessera")
    common = ["-n", namespace, "-f", str(values_file(tmp_path, {**NO_CLUSTER_SINGLETONS, **OWN_CA}))]
    core = client.CoreV1Api(kube)
    service = f"{release}-exporter"

    def exporter_service() -> dict[str, Any]:
        spec: dict[str, Any] = raw_json(
            core.read_namespaced_service(service, namespace, _preload_content=False)
        )["spec"]
        return spec

    # A nodePort no other test takes, so that this release can sit beside others.
    node_port = ["--set", "exporter.service.type=NodePort", "--set", "exporter.service.nodePort=31899"]
    helm(tmp_path, "install", release, str(CHART), *common, *node_port, kubeconfig=cluster.admin_kubeconfig)
    try:
        assert exporter_service()["type"] == "NodePort"
        with pytest.raises(HelmError) as refused:
            helm(tmp_path, "upgrade", release, str(CHART), *common, kubeconfig=cluster.admin_kubeconfig)
        assert "clusterIP" in str(refused.value)
        core.delete_namespaced_service(service, namespace)
        helm(tmp_path, "upgrade", release, str(CHART), *common, kubeconfig=cluster.admin_kubeconfig)
        assert (exporter_service()["type"], exporter_service()["clusterIP"]) == ("ClusterIP", "None")
    finally:
        helm(tmp_path, "uninstall", release, "-n", namespace, "--wait", kubeconfig=cluster.admin_kubeconfig)
