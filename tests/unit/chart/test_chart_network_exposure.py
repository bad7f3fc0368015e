"""What of the chart is reachable over the network, rendered by ``helm template`` (no cluster): each
component's NetworkPolicy selects exactly that component's pods and admits only what it serves, to
whom (the API server to the webhook's HTTPS port, Prometheus to the metrics ports, never a health
port, which only the pod's own node probes); the exporter's Service is headless unless a NodePort is
asked for; NOTES warns where the metrics are open. The test bed's CNI does not enforce NetworkPolicy,
so the real API server's view (a server-side dry run) is in tests/integration/test_chart_install.py
and enforcement is left to the cluster's CNI (docs/install.md, "Network policies")."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import pytest
import yaml

from testbed.chart_bed import node_layout_values
from tests.chart_helm import CHART, HelmError, find, helm, kube_version, render

WITH_KUEUE = ("--api-versions", "kueue.x-k8s.io/v1beta2")
CHECK_ON: dict[str, Any] = {"queue": {"admissionCheck": {"enabled": True}}}
HOST_NETWORK: dict[str, Any] = {"kubeletPlugin": node_layout_values("/tmp/tessera-nodes", "/usr/lib")}
PROMETHEUS_PEER = {
    "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}},
    "podSelector": {"matchLabels": {"app.kubernetes.io/name": "prometheus"}},
}
# The workload whose pods each policy guards.
WORKLOADS = {
    "tessera-webhook": ("Deployment", "tessera-webhook"),
    "tessera-kubeletplugin": ("DaemonSet", "tessera-kubeletplugin"),
    "tessera-exporter": ("DaemonSet", "tessera-exporter"),
    "tessera-admissioncheck": ("Deployment", "tessera-admissioncheck"),
}


@pytest.fixture(scope="module")
def home(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("helm-network")


@pytest.fixture(scope="module")
def default(home: Path) -> list[dict[str, Any]]:
    return render(home / "default")


@pytest.fixture(scope="module")
def with_check(home: Path) -> list[dict[str, Any]]:
    return render(home / "check", CHECK_ON, extra=WITH_KUEUE)


def refusal(home: Path, values: dict[str, Any]) -> str:
    with pytest.raises(HelmError) as caught:
        render(home / "refused", values)
    return str(caught.value)


def policies(objects: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {o["metadata"]["name"]: o for o in objects if o["kind"] == "NetworkPolicy"}


def pod_spec(objects: list[dict[str, Any]], policy: str) -> dict[str, Any]:
    kind, name = WORKLOADS[policy]
    spec: dict[str, Any] = find(objects, kind, name)["spec"]["template"]["spec"]
    return spec


def container_ports(objects: list[dict[str, Any]], policy: str) -> dict[str, int]:
    """The policy's pods' container ports, by name."""
    return {
        p["name"]: p["containerPort"]
        for c in pod_spec(objects, policy)["containers"]
        for p in c.get("ports", [])
    }


def admitted(policy: dict[str, Any]) -> dict[int, list[dict[str, Any]] | None]:
    """Each port the policy admits, with its peers (None: from any source)."""
    out: dict[int, list[dict[str, Any]] | None] = {}
    for rule in policy["spec"].get("ingress", []):
        assert [p["protocol"] for p in rule["ports"]] == ["TCP"] * len(rule["ports"])
        for port in rule["ports"]:
            out[port["port"]] = rule.get("from")
    return out


# ------------------------------------------------------------------------------------ the policies


def test_each_policy_selects_exactly_its_components_pods(with_check: list[dict[str, Any]]) -> None:
    found = policies(with_check)
    assert set(found) == set(WORKLOADS)
    for name, policy in found.items():
        kind, workload = WORKLOADS[name]
        selector = find(with_check, kind, workload)["spec"]["selector"]["matchLabels"]
        assert policy["spec"]["podSelector"] == {"matchLabels": selector}, name
        assert policy["metadata"]["namespace"] == "tessera"
        # Ingress only: egress goes to the API server, whose address the chart cannot know.
        assert policy["spec"]["policyTypes"] == ["Ingress"], name


def test_the_webhook_admits_the_api_server_on_https_and_prometheus_on_metrics(
    default: list[dict[str, Any]],
) -> None:
    ports = container_ports(default, "tessera-webhook")
    assert admitted(policies(default)["tessera-webhook"]) == {
        ports["https"]: None,
        ports["metrics"]: [PROMETHEUS_PEER],
    }


def test_only_prometheus_reaches_the_exporter_and_no_one_the_health_port(
    default: list[dict[str, Any]],
) -> None:
    ports = container_ports(default, "tessera-exporter")
    assert admitted(policies(default)["tessera-exporter"]) == {ports["metrics"]: [PROMETHEUS_PEER]}
    assert ports["exporter-health"] not in admitted(policies(default)["tessera-exporter"])


def test_no_one_reaches_the_plugin_but_its_own_node(default: list[dict[str, Any]]) -> None:
    """The plugin serves the kubelet on unix sockets; its health port is for the kubelet's probes,
    which come from the pod's own node, which a NetworkPolicy always admits."""
    assert admitted(policies(default)["tessera-kubeletplugin"]) == {}


def test_only_prometheus_reaches_the_admission_checks_metrics(with_check: list[dict[str, Any]]) -> None:
    ports = container_ports(with_check, "tessera-admissioncheck")
    assert admitted(policies(with_check)["tessera-admissioncheck"]) == {ports["health"]: [PROMETHEUS_PEER]}


def test_api_server_cidrs_narrow_the_webhooks_https_port(home: Path) -> None:
    objects = render(
        home / "cidrs", {"networkPolicy": {"webhook": {"apiServerCIDRs": ["10.0.0.0/24", "fd00:10::/64"]}}}
    )
    https = container_ports(objects, "tessera-webhook")["https"]
    assert admitted(policies(objects)["tessera-webhook"])[https] == [
        {"ipBlock": {"cidr": "10.0.0.0/24"}},
        {"ipBlock": {"cidr": "fd00:10::/64"}},
    ]


def test_scrapers_and_extra_rules_are_values(home: Path) -> None:
    extra = {"from": [{"ipBlock": {"cidr": "192.0.2.0/24"}}], "ports": [{"port": 31995, "protocol": "TCP"}]}
    scrapers = {"namespaceSelector": {"matchLabels": {"team": "observability"}}, "podSelector": {}}
    objects = render(
        home / "widened",
        {"networkPolicy": {"scrapers": [scrapers], "exporter": {"extraIngress": [extra]}}},
    )
    rules = policies(objects)["tessera-exporter"]["spec"]["ingress"]
    # The list replaces the default peer whole (a map would merge into it).
    assert rules == [{"ports": [{"port": 31995, "protocol": "TCP"}], "from": [scrapers]}, extra]


def test_without_the_exporter_no_policy_admits_scrapers_to_the_node(home: Path) -> None:
    objects = render(home / "no-exporter", {"exporter": {"enabled": False, "service": {"enabled": False}}})
    assert "tessera-exporter" not in policies(objects)
    assert admitted(policies(objects)["tessera-kubeletplugin"]) == {}


def test_a_daemon_on_the_host_network_gets_no_policy_that_would_not_apply(home: Path) -> None:
    objects = render(home / "host-network", HOST_NETWORK)
    assert set(policies(objects)) == {"tessera-webhook"}
    message = refusal(home, {**HOST_NETWORK, "networkPolicy": {"exporter": {"extraIngress": [{}]}}})
    assert "networkPolicy.exporter.extraIngress" in message and "firewall" in message


def test_policies_can_be_turned_off_but_not_half_configured(home: Path) -> None:
    assert policies(render(home / "off", {"networkPolicy": {"enabled": False}})) == {}
    message = refusal(
        home, {"networkPolicy": {"enabled": False, "webhook": {"apiServerCIDRs": ["10.0.0.0/8"]}}}
    )
    assert "networkPolicy.webhook sets rules, but networkPolicy.enabled is false" in message


def test_no_scrapers_is_refused_since_an_empty_from_admits_everyone(home: Path) -> None:
    # In a NetworkPolicy rule, from: [] means every source: an emptied list must not open the port.
    assert "scrapers" in refusal(home, {"networkPolicy": {"scrapers": []}})
    assert "scrapers" in refusal(home, {"networkPolicy": {"scrapers": [{}]}})


@pytest.mark.parametrize("cidr", ["10.0.0.0", "10.0.0.0/8; rm", "any"])
def test_the_schema_refuses_what_is_not_a_cidr(home: Path, cidr: str) -> None:
    assert "apiServerCIDRs" in refusal(home, {"networkPolicy": {"webhook": {"apiServerCIDRs": [cidr]}}})


# ------------------------------------------------------------------------------ the exporter Service


def test_the_exporter_service_is_headless_and_lists_every_daemon(default: list[dict[str, Any]]) -> None:
    service = find(default, "Service", "tessera-exporter")
    assert service["spec"]["type"] == "ClusterIP"
    assert service["spec"]["clusterIP"] == "None"
    assert service["spec"]["ports"] == [
        {"name": "metrics", "port": 31995, "targetPort": "metrics", "protocol": "TCP"}
    ]
    assert (
        service["spec"]["selector"]
        == find(default, "DaemonSet", "tessera-exporter")["spec"]["selector"]["matchLabels"]
    )
    assert "metrics" in container_ports(default, "tessera-exporter")


def test_the_service_monitor_follows_the_headless_service(home: Path) -> None:
    objects = render(home / "service-monitor", {"exporter": {"serviceMonitor": {"enabled": True}}})
    monitor = find(objects, "ServiceMonitor")
    labels = find(objects, "Service", "tessera-exporter")["metadata"]["labels"]
    assert monitor["spec"]["selector"]["matchLabels"].items() <= labels.items()
    assert [(e["port"], e["honorLabels"]) for e in monitor["spec"]["endpoints"]] == [("metrics", True)]


def test_the_pod_monitor_keeps_the_tenants_labels(home: Path) -> None:
    objects = render(home / "pod-monitor", {"exporter": {"podMonitor": {"enabled": True}}})
    monitor = find(objects, "PodMonitor")
    assert (
        monitor["spec"]["selector"]["matchLabels"]
        == find(objects, "DaemonSet", "tessera-exporter")["spec"]["selector"]["matchLabels"]
    )
    # The series carry namespace, pod and container of the workload, not of the daemon's pod.
    assert [(e["port"], e["honorLabels"]) for e in monitor["spec"]["podMetricsEndpoints"]] == [
        ("metrics", True)
    ]


def test_a_node_port_is_there_only_when_asked_for(home: Path) -> None:
    objects = render(home / "node-port", {"exporter": {"service": {"type": "NodePort"}}})
    service = find(objects, "Service", "tessera-exporter")
    assert service["spec"]["type"] == "NodePort"
    assert "clusterIP" not in service["spec"]
    # Each node answers with its own daemon's page, and keeps the scraper's address for the policy.
    assert service["spec"]["externalTrafficPolicy"] == "Local"
    assert service["spec"]["ports"][0]["nodePort"] == 31995
    assert "outside the default NodePort range" in refusal(
        home, {"exporter": {"service": {"type": "NodePort", "nodePort": 8080}}}
    )


# -------------------------------------------------------------------------------------------- NOTES


def notes(home: Path, values: dict[str, Any]) -> str:
    """NOTES.txt as Helm renders it after an install with ``values``: ``helm template`` prints no
    NOTES, so a copy of the chart renders the same text as a template of its own."""
    chart = home / "notes-chart"
    shutil.rmtree(chart, ignore_errors=True)
    shutil.copytree(CHART, chart)
    text = (chart / "templates" / "NOTES.txt").read_text()
    (chart / "templates" / "NOTES.txt").unlink()
    (chart / "templates" / "_notes.tpl").write_text('{{- define "notes" -}}' + text + "{{- end -}}")
    (chart / "templates" / "zz-notes.yaml").write_text('notes: {{ include "notes" . | toJson }}\n')
    values_path = home / "notes-values.yaml"
    values_path.write_text(yaml.safe_dump(values))
    result = helm(
        home,
        "template",
        "tessera",
        str(chart),
        "-n",
        "tessera",
        "--kube-version",
        kube_version(),
        "-f",
        str(values_path),
        "--show-only",
        "templates/zz-notes.yaml",
    )
    return str(yaml.safe_load(result.stdout)["notes"])


def test_notes_say_where_the_metrics_are_open(home: Path) -> None:
    default = notes(home, {})
    assert "listed by the headless Service tessera-exporter" in default
    assert "may reach the daemons' port 31995 and the webhook's metrics port" in default
    assert "only where the cluster's CNI enforces NetworkPolicy" in default
    assert "WARNING" not in default
    node_port = notes(home, {"exporter": {"service": {"type": "NodePort"}}})
    assert "WARNING: exporter.service.type is NodePort: every node answers on port 31995" in node_port
    host_network = notes(home, HOST_NETWORK)
    assert "WARNING: the daemon runs on the host network, where no NetworkPolicy applies" in host_network
    assert "from port 31995 (and the health ports 51515, 51516)" in host_network
    assert "the daemons' port" not in host_network
    off = notes(home, {"networkPolicy": {"enabled": False}})
    assert "WARNING: networkPolicy.enabled is false: any pod can read every node's metrics" in off
