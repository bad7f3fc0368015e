"""charts/tessera rendered by ``helm template`` (no cluster): the fields that make the install work and
keep it least-privileged, and the values that are refused. The real API server's view is in
tests/integration/test_chart_install.py."""

from __future__ import annotations

import base64
import datetime
import json
from pathlib import Path
from typing import Any

import pytest
import yaml
from cryptography import x509

from tessera.names import MIG_DEVICE_CLASS
from testbed.chart_bed import node_layout_values
from tests.chart_helm import CHART, HelmError, find, helm, kinds, render

FILES = CHART / "files"
NODE_ROOT = "/tmp/tessera-nodes"
TEST_BED_VALUES: dict[str, Any] = {
    "kubeletPlugin": {
        **node_layout_values(NODE_ROOT, f"{NODE_ROOT}/$(NODE_NAME)/driver/usr/lib/x86_64-linux-gnu"),
        "containerEnv": ["SIMGPU_CONFIG=/tmp/tessera-nodes/$(NODE_NAME)/simgpu/simgpu.conf"],
        "containerMounts": ["/tmp/tessera-nodes/$(NODE_NAME)/simgpu"],
    },
}


@pytest.fixture(scope="module")
def home(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("helm")


@pytest.fixture(scope="module")
def default(home: Path) -> list[dict[str, Any]]:
    return render(home / "default")


def refusal(home: Path, values: dict[str, Any]) -> str:
    """The error ``helm template`` gives for ``values`` (it must refuse them)."""
    with pytest.raises(HelmError) as caught:
        render(home / "refused", values)
    return str(caught.value)


def plugin_container(objects: list[dict[str, Any]]) -> dict[str, Any]:
    (container,) = find(objects, "DaemonSet", "tessera-kubeletplugin")["spec"]["template"]["spec"][
        "containers"
    ]
    assert isinstance(container, dict)
    return container


def exporter_container(objects: list[dict[str, Any]]) -> dict[str, Any]:
    (container,) = find(objects, "DaemonSet", "tessera-exporter")["spec"]["template"]["spec"]["containers"]
    assert isinstance(container, dict)
    return container


def env_of(container: dict[str, Any]) -> dict[str, Any]:
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in container["env"]}


def arg_values(container: dict[str, Any]) -> dict[str, str]:
    return dict(a.removeprefix("--").split("=", 1) for a in container["args"] if "=" in a)


# --------------------------------------------------------------------------------------------- lint


def test_helm_lint_is_clean_with_the_schema(home: Path) -> None:
    result = helm(home, "lint", "--strict", str(CHART))
    assert "0 chart(s) failed" in result.stdout, result.stdout


def test_every_value_in_values_yaml_is_described_by_the_schema() -> None:
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    schema = json.loads((CHART / "values.schema.json").read_text())
    missing: list[str] = []

    def walk(value: Any, node: dict[str, Any], path: str) -> None:
        if not isinstance(value, dict) or not value:
            return
        props = node.get("properties")
        if props is None:  # a free-form map (labels, nodeSelector, affinity)
            assert node.get("type") == "object", path
            return
        for key, child in value.items():
            if key not in props:
                missing.append(f"{path}.{key}")
            else:
                walk(child, props[key], f"{path}.{key}")

    walk(values, schema, "")
    assert not missing


@pytest.mark.parametrize(
    "values, message",
    [
        ({"kubeletPlugin": {"bogus": 1}}, "additional properties 'bogus' not allowed"),
        ({"queue": {"admissionCheck": {"bogus": True}}}, "additional properties 'bogus' not allowed"),
        ({"kubeletPlugin": {"driverSource": "magic"}}, "driverSource"),
        ({"webhook": {"tls": {"source": "vault"}}}, "source"),
        ({"exporter": {"port": 0}}, "port"),
        ({"kubeletPlugin": {"hostPaths": {"cdiDir": "relative/cdi"}}}, "cdiDir"),
        ({"webhook": {"seccomp": "strict"}}, "seccomp"),
        ({"webhook": {"highPriorityNamespaces": ["team-a,team-b"]}}, "highPriorityNamespaces"),
    ],
    ids=[
        "unknown-key",
        "queue-unknown-key",
        "driver-source",
        "tls-source",
        "port-zero",
        "relative-path",
        "seccomp-mode",
        "namespace-list-in-one-name",
    ],
)
def test_the_schema_refuses_wrong_values(home: Path, values: dict[str, Any], message: str) -> None:
    assert message in refusal(home, values)


# ------------------------------------------------------------------------------------ what exists


def test_the_default_install_has_every_component(default: list[dict[str, Any]]) -> None:
    assert kinds(default) >= {
        "DaemonSet",
        "DeviceClass",
        "ServiceAccount",
        "ClusterRole",
        "ClusterRoleBinding",
        "ValidatingAdmissionPolicy",
        "ValidatingAdmissionPolicyBinding",
        "Deployment",
        "PodDisruptionBudget",
        "Service",
        "MutatingWebhookConfiguration",
        "Role",
        "RoleBinding",
    }
    assert not kinds(default) & {"ServiceMonitor", "PodMonitor", "PrometheusRule", "Issuer", "Certificate"}
    # No Secret: the webhook makes its serving and client certificates (no key material renders).
    assert "Secret" not in kinds(default)
    shares = find(default, "DeviceClass", "gpu.tessera.dev")
    assert shares["spec"]["selectors"] == [
        {
            "cel": {
                "expression": "device.driver == 'gpu.tessera.dev' && "
                "device.attributes['gpu.tessera.dev'].type == 'gpu'"
            }
        }
    ]
    mig = find(default, "DeviceClass", MIG_DEVICE_CLASS)
    assert mig["spec"]["selectors"] == [
        {
            "cel": {
                "expression": "device.driver == 'gpu.tessera.dev' && "
                "device.attributes['gpu.tessera.dev'].type == 'mig'"
            }
        }
    ]


def test_images_default_to_the_app_version_and_can_be_overridden(
    home: Path, default: list[dict[str, Any]]
) -> None:
    app_version = yaml.safe_load((CHART / "Chart.yaml").read_text())["appVersion"]
    assert plugin_container(default)["image"] == f"ghcr.io/tessera-gpu/tessera-driver:{app_version}"
    webhook = find(default, "Deployment")["spec"]["template"]["spec"]["containers"][0]
    assert webhook["image"] == f"ghcr.io/tessera-gpu/tessera-webhook:{app_version}"
    local = render(
        home / "local-images",
        {
            "kubeletPlugin": {"image": {"repository": "tessera.local/tessera-driver", "tag": "v1"}},
            "webhook": {
                "image": {"repository": "tessera.local/tessera-webhook", "tag": "v1", "pullPolicy": "Never"}
            },
        },
    )
    assert plugin_container(local)["image"] == "tessera.local/tessera-driver:v1"
    webhook = find(local, "Deployment")["spec"]["template"]["spec"]["containers"][0]
    assert (webhook["image"], webhook["imagePullPolicy"]) == ("tessera.local/tessera-webhook:v1", "Never")


# ------------------------------------------------------------------------------------- node daemon


def test_the_daemonset_runs_on_gpu_nodes_with_rolling_update_socket_names(
    default: list[dict[str, Any]],
) -> None:
    daemonset = find(default, "DaemonSet", "tessera-kubeletplugin")
    pod = daemonset["spec"]["template"]["spec"]
    assert pod["nodeSelector"] == {"nvidia.com/gpu.present": "true"}
    assert daemonset["spec"]["updateStrategy"]["rollingUpdate"] == {"maxSurge": 1, "maxUnavailable": 0}
    container = plugin_container(default)
    assert container["command"] == ["tessera-driver"]
    env = env_of(container)
    assert env["POD_UID"] == {"fieldRef": {"fieldPath": "metadata.uid"}}
    assert env["NODE_NAME"] == {"fieldRef": {"fieldPath": "spec.nodeName"}}
    args = arg_values(container)
    assert args["pod-uid"] == "$(POD_UID)"
    assert args["node-name"] == "$(NODE_NAME)"
    assert "metrics-port" not in args  # the exporter is a process of its own


def test_the_exporter_runs_beside_the_plugin_in_a_daemonset_of_its_own_with_its_own_probes(
    default: list[dict[str, Any]],
) -> None:
    """Its own process and pod, so that nothing a scrape meets can stop a prepare: probes of its own,
    on a port of its own (a proxy in front of /metrics leaves them alone), its own account, on the
    same nodes as the plugin."""
    container = exporter_container(default)
    assert container["command"] == ["tessera-exporter"]
    assert container["image"] == plugin_container(default)["image"]
    args = arg_values(container)
    assert args["node-name"] == "$(NODE_NAME)"
    assert args["metrics-port"] == "31995"
    assert args["state-dir"] == arg_values(plugin_container(default))["state-dir"]
    assert container["ports"] == [
        {"name": "metrics", "containerPort": 31995, "protocol": "TCP"},
        {"name": "exporter-health", "containerPort": 51516, "protocol": "TCP"},
    ]
    assert args["health-port"] == "51516"
    assert container["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "exporter-health"}
    assert container["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "exporter-health"}
    assert container["startupProbe"]["httpGet"] == {"path": "/healthz", "port": "exporter-health"}
    assert [p["name"] for p in plugin_container(default)["ports"]] == ["health"]
    exporter = find(default, "DaemonSet", "tessera-exporter")
    plugin = find(default, "DaemonSet", "tessera-kubeletplugin")
    assert exporter["spec"]["template"]["spec"]["serviceAccountName"] == "tessera-exporter"
    assert exporter["spec"]["selector"]["matchLabels"]["app.kubernetes.io/component"] == "exporter"
    for scheduling in ("nodeSelector", "tolerations"):
        assert (
            exporter["spec"]["template"]["spec"][scheduling] == plugin["spec"]["template"]["spec"][scheduling]
        )


def test_the_daemons_probes_use_its_health_port(default: list[dict[str, Any]]) -> None:
    container = plugin_container(default)
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert arg_values(container)["health-port"] == str(ports["health"])
    assert container["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "health"}
    assert container["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "health"}
    assert container["startupProbe"]["httpGet"] == {"path": "/healthz", "port": "health"}


def test_every_host_path_is_mounted_at_its_own_path(default: list[dict[str, Any]]) -> None:
    """The daemon writes these paths into what the kubelet and the runtime read on the host."""
    pod = find(default, "DaemonSet", "tessera-kubeletplugin")["spec"]["template"]["spec"]
    mounts = {m["name"]: m["mountPath"] for m in pod["containers"][0]["volumeMounts"]}
    host_paths = {v["name"]: v["hostPath"]["path"] for v in pod["volumes"] if "hostPath" in v}
    assert host_paths
    assert all(mounts[name] == path for name, path in host_paths.items())
    assert set(host_paths.values()) == {
        "/var/lib/kubelet/plugins_registry",
        "/var/lib/kubelet/plugins",
        "/var/run/cdi",
        "/var/lib/tessera",
        "/usr/lib/x86_64-linux-gnu/libnvidia-ml.so.1",
    }
    args = arg_values(pod["containers"][0])
    assert (args["kubelet-root"], args["cdi-dir"], args["state-dir"]) == (
        "/var/lib/kubelet",
        "/var/run/cdi",
        "/var/lib/tessera",
    )


def test_with_the_toolkit_the_daemon_is_not_privileged(default: list[dict[str, Any]]) -> None:
    pod = find(default, "DaemonSet", "tessera-kubeletplugin")["spec"]["template"]["spec"]
    security = pod["containers"][0]["securityContext"]
    assert security["privileged"] is False
    assert security["allowPrivilegeEscalation"] is False
    assert security["readOnlyRootFilesystem"] is True
    assert security["capabilities"] == {"drop": ["ALL"]}
    assert "hostNetwork" not in pod


def test_the_exporter_reads_host_pids_with_only_kill_and_the_daemons_state_read_only(
    default: list[dict[str, Any]],
) -> None:
    """It matches NVML's host PIDs to containers by /proc/<pid>/cgroup, which anyone may read: the
    pod shares the host's PIDs for it. Its one capability, KILL, stops a claim's process that took
    GPU memory around the shim whatever user it runs as; the plugin holds none, and its pod keeps a
    PID namespace of its own, so it can neither see nor signal the node's processes."""
    assert find(default, "DaemonSet", "tessera-exporter")["spec"]["template"]["spec"]["hostPID"] is True
    assert "hostPID" not in find(default, "DaemonSet", "tessera-kubeletplugin")["spec"]["template"]["spec"]
    security = exporter_container(default)["securityContext"]
    assert security["privileged"] is False
    assert security["allowPrivilegeEscalation"] is False
    assert security["readOnlyRootFilesystem"] is True
    assert security["capabilities"] == {"drop": ["ALL"], "add": ["KILL"]}
    assert plugin_container(default)["securityContext"]["capabilities"] == {"drop": ["ALL"]}
    mounts = {m["name"]: m for m in exporter_container(default)["volumeMounts"]}
    assert set(mounts) == {"tmp", "state", "nvml"}
    assert mounts["state"]["readOnly"] is True and mounts["nvml"]["readOnly"] is True


def test_the_bypass_action_tolerance_and_bound_reach_the_exporter_and_report_needs_no_capability(
    default: list[dict[str, Any]], home: Path
) -> None:
    args = arg_values(exporter_container(default))
    assert (args["bypass-action"], args["bypass-tolerance"], args["bypass-bound"]) == ("stop", "512Mi", "2")
    values = {"exporter": {"bypass": {"action": "report", "tolerance": "64Mi", "bound": 0.5}}}
    objects = render(home / "report", values)
    container = exporter_container(objects)
    args = arg_values(container)
    assert [args["bypass-action"], args["bypass-tolerance"], args["bypass-bound"]] == [
        "report",
        "64Mi",
        "0.5",
    ]
    assert container["securityContext"]["capabilities"] == {"drop": ["ALL"]}


def test_without_the_exporter_nothing_of_it_is_installed(home: Path) -> None:
    objects = render(home / "no-exporter", {"exporter": {"enabled": False, "service": {"enabled": False}}})
    pod = find(objects, "DaemonSet", "tessera-kubeletplugin")["spec"]["template"]["spec"]
    assert [c["name"] for c in pod["containers"]] == ["plugin"]
    assert pod["containers"][0]["securityContext"]["capabilities"] == {"drop": ["ALL"]}
    assert [o["kind"] for o in objects if "exporter" in o["metadata"]["name"]] == []


@pytest.mark.parametrize("source", ["own", "auto"])
def test_a_daemon_that_mounts_the_driver_itself_is_privileged(home: Path, source: str) -> None:
    objects = render(home / source, {"kubeletPlugin": {"driverSource": source}})
    pod = find(objects, "DaemonSet", "tessera-kubeletplugin")["spec"]["template"]["spec"]
    assert pod["containers"][0]["securityContext"]["privileged"] is True
    # No toolkit brings the device nodes NVML opens: only a privileged container sees the host's.
    assert exporter_container(objects)["securityContext"]["privileged"] is True
    paths = {v["hostPath"]["path"] for v in pod["volumes"] if "hostPath" in v}
    assert "/usr/lib/x86_64-linux-gnu/libcuda.so.1" in paths
    assert ("/etc/cdi" in paths) == (source == "auto")  # auto looks for the toolkit's spec there


def test_test_bed_nodes_share_one_host_folder_and_expand_their_node_name(home: Path) -> None:
    objects = render(home / "test-bed", TEST_BED_VALUES)
    pod = find(objects, "DaemonSet", "tessera-kubeletplugin")["spec"]["template"]["spec"]
    host_paths = [v["hostPath"]["path"] for v in pod["volumes"] if "hostPath" in v]
    assert host_paths == [NODE_ROOT]
    assert {"name": "node-root", "mountPath": NODE_ROOT} in pod["containers"][0]["volumeMounts"]
    container = pod["containers"][0]
    args = arg_values(container)
    assert args["kubelet-root"] == f"{NODE_ROOT}/$(NODE_NAME)/kubelet"
    assert args["driver-library-dir"] == f"{NODE_ROOT}/$(NODE_NAME)/driver/usr/lib/x86_64-linux-gnu"
    assert args["container-env"] == "SIMGPU_CONFIG=/tmp/tessera-nodes/$(NODE_NAME)/simgpu/simgpu.conf"
    assert args["container-mount"] == "/tmp/tessera-nodes/$(NODE_NAME)/simgpu"
    # Several nodes on one host: each daemon binds to its own node's address.
    assert pod["hostNetwork"] is True
    assert args["health-address"] == "$(HOST_IP)"
    exporter = exporter_container(objects)
    assert arg_values(exporter)["metrics-address"] == arg_values(exporter)["health-address"] == "$(HOST_IP)"
    assert arg_values(exporter)["state-dir"] == args["state-dir"]
    # The simulated driver's state under the node root is written by every NVML user.
    assert {"name": "node-root", "mountPath": NODE_ROOT} in exporter["volumeMounts"]
    assert env_of(exporter)["HOST_IP"] == {"fieldRef": {"fieldPath": "status.hostIP"}}
    assert env_of(exporter)["LD_LIBRARY_PATH"] == env_of(container)["LD_LIBRARY_PATH"]
    env = env_of(container)
    assert env["HOST_IP"] == {"fieldRef": {"fieldPath": "status.hostIP"}}
    assert env["LD_LIBRARY_PATH"] == f"{NODE_ROOT}/$(NODE_NAME)/driver/usr/lib/x86_64-linux-gnu"
    # $(NODE_NAME) is declared before the variables that use it, or Kubernetes would not expand it.
    names = [e["name"] for e in container["env"]]
    assert names.index("NODE_NAME") < names.index("LD_LIBRARY_PATH")


def test_node_name_outside_the_node_root_is_refused(home: Path) -> None:
    message = refusal(home, {"kubeletPlugin": {"hostPaths": {"stateDir": "/var/lib/$(NODE_NAME)/tessera"}}})
    assert "kubeletPlugin.hostPaths.stateDir" in message and "nodeRoot" in message


# -------------------------------------------------------------------------------------------- RBAC


def rules_of(objects: list[dict[str, Any]], name: str) -> list[dict[str, Any]]:
    rules: list[dict[str, Any]] = find(objects, "ClusterRole", name)["rules"]
    return rules


def test_the_exporters_role_is_exactly_its_rules_file(default: list[dict[str, Any]]) -> None:
    expected = yaml.safe_load((FILES / "exporter-rules.yaml").read_text())
    assert rules_of(default, "tessera-exporter") == expected
    binding = find(default, "ClusterRoleBinding", "tessera-exporter")
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": "tessera-exporter", "namespace": "tessera"}
    ]


def test_the_plugins_role_is_exactly_its_rules_file(default: list[dict[str, Any]]) -> None:
    expected = yaml.safe_load((FILES / "kubeletplugin-rules.yaml").read_text())
    assert rules_of(default, "tessera-kubeletplugin") == expected
    binding = find(default, "ClusterRoleBinding", "tessera-kubeletplugin")
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": "tessera-kubeletplugin", "namespace": "tessera"}
    ]
    assert (
        find(default, "DaemonSet", "tessera-kubeletplugin")["spec"]["template"]["spec"]["serviceAccountName"]
        == "tessera-kubeletplugin"
    )


def test_the_webhook_may_touch_its_configuration_only_when_it_keeps_the_ca_itself(
    home: Path, default: list[dict[str, Any]]
) -> None:
    file_rules = yaml.safe_load((FILES / "webhook-rules.yaml").read_text())
    others = [r for r in file_rules if "mutatingwebhookconfigurations" not in r["resources"]]
    chart_ca = render(home / "chart-ca", {"webhook": {"tls": {"source": "chart"}}})
    assert rules_of(chart_ca, "tessera-webhook") == others
    own_ca = render(home / "self", {"webhook": {"tls": {"source": "self"}, "replicas": 1}})
    for kept in (default, own_ca):
        configuration = [r for r in rules_of(kept, "tessera-webhook") if r not in others]
        assert configuration == [
            {
                "apiGroups": ["admissionregistration.k8s.io"],
                "resources": ["mutatingwebhookconfigurations"],
                "resourceNames": ["tessera-webhook"],
                "verbs": ["get", "update"],
            }
        ]


def test_by_default_the_webhook_may_read_and_update_only_its_shared_secret(
    home: Path, default: list[dict[str, Any]]
) -> None:
    role = find(default, "Role", "tessera-webhook")
    assert role["metadata"]["namespace"] == "tessera"
    assert role["rules"] == [
        {
            "apiGroups": [""],
            "resources": ["secrets"],
            # The shared serving certificate, and the API server's client certificate (no CA given).
            "resourceNames": ["tessera-webhook-shared-tls", "tessera-webhook-apiserver-client"],
            "verbs": ["get", "update"],
        },
        {"apiGroups": [""], "resources": ["secrets"], "verbs": ["create"]},
    ]
    binding = find(default, "RoleBinding", "tessera-webhook")
    assert binding["roleRef"] == {
        "apiGroup": "rbac.authorization.k8s.io",
        "kind": "Role",
        "name": "tessera-webhook",
    }
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": "tessera-webhook", "namespace": "tessera"}
    ]
    chart_ca = render(
        home / "chart-ca-role",
        {"webhook": {"tls": {"source": "chart"}, "clientAuth": {"caSecret": "corp-ca"}}},
    )
    assert not [
        o for o in chart_ca if o["kind"] in ("Role", "RoleBinding") and "webhook" in o["metadata"]["name"]
    ]


def test_the_slice_policy_compares_the_tokens_node_and_our_driver_with_the_slices(
    default: list[dict[str, Any]],
) -> None:
    policy = find(default, "ValidatingAdmissionPolicy")
    spec = policy["spec"]
    assert spec["failurePolicy"] == "Fail"
    assert spec["matchConstraints"]["resourceRules"][0]["operations"] == ["CREATE", "UPDATE", "DELETE"]
    assert "system:serviceaccount:tessera:tessera-kubeletplugin" in spec["matchConditions"][0]["expression"]
    assert "authentication.kubernetes.io/node-name" in spec["variables"][0]["expression"]
    assert "variables.slice.spec.driver == 'gpu.tessera.dev'" in [
        v["expression"] for v in spec["validations"]
    ]
    binding = find(default, "ValidatingAdmissionPolicyBinding")
    assert binding["spec"] == {"policyName": policy["metadata"]["name"], "validationActions": ["Deny"]}


# ------------------------------------------------------------------------------------------ webhook


def test_the_webhook_is_highly_available(default: list[dict[str, Any]]) -> None:
    deployment = find(default, "Deployment")
    assert deployment["spec"]["replicas"] == 2
    pod = deployment["spec"]["template"]["spec"]
    term = pod["affinity"]["podAntiAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"][0]
    assert term["podAffinityTerm"]["topologyKey"] == "kubernetes.io/hostname"
    assert (
        term["podAffinityTerm"]["labelSelector"]["matchLabels"]
        == deployment["spec"]["selector"]["matchLabels"]
    )
    pdb = find(default, "PodDisruptionBudget")
    assert pdb["spec"]["maxUnavailable"] == 1
    assert pdb["spec"]["selector"] == deployment["spec"]["selector"]
    assert pod["securityContext"]["runAsNonRoot"] is True
    container = pod["containers"][0]
    assert container["securityContext"]["capabilities"] == {"drop": ["ALL"]}
    assert container["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "probes"}
    assert container["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "probes"}


def test_the_webhooks_probes_have_a_port_no_scraper_shares(default: list[dict[str, Any]]) -> None:
    container = find(default, "Deployment")["spec"]["template"]["spec"]["containers"][0]
    ports = {port["name"]: port["containerPort"] for port in container["ports"]}
    assert ports == {"https": 8443, "metrics": 8080, "probes": 8081}
    assert (arg_values(container)["metrics-port"], arg_values(container)["probe-port"]) == ("8080", "8081")


def test_by_default_no_namespace_is_granted_priority_0_and_seccomp_is_enforced(
    default: list[dict[str, Any]],
) -> None:
    webhook = find(default, "Deployment")["spec"]["template"]["spec"]["containers"][0]
    assert (arg_values(webhook)["high-priority-namespaces"], arg_values(webhook)["seccomp"]) == (
        "",
        "enforce",
    )
    assert not [a for a in plugin_container(default)["args"] if "high-priority" in a]


def test_the_namespaces_granted_priority_0_reach_the_webhook_and_every_node_daemon(home: Path) -> None:
    """A claim written by hand never passes the webhook: the daemon must know the same list."""
    objects = render(
        home / "granted", {"webhook": {"highPriorityNamespaces": ["inference", "batch"], "seccomp": "warn"}}
    )
    webhook = find(objects, "Deployment")["spec"]["template"]["spec"]["containers"][0]
    assert arg_values(webhook)["high-priority-namespaces"] == "inference,batch"
    assert arg_values(webhook)["seccomp"] == "warn"
    plugin_args = plugin_container(objects)["args"]
    granted = [a for a in plugin_args if a.startswith("--high-priority-namespace=")]
    assert granted == ["--high-priority-namespace=inference", "--high-priority-namespace=batch"]


def test_the_webhook_configuration_is_the_shipped_file_pointed_at_the_release(home: Path) -> None:
    objects = render(home / "elsewhere", release="gpus", namespace="gpu-system")
    rendered = find(objects, "MutatingWebhookConfiguration")
    shipped = yaml.safe_load((FILES / "webhook-configuration.yaml").read_text())
    assert rendered["metadata"]["name"] == "gpus-tessera-webhook"
    (webhook,) = rendered["webhooks"]
    (original,) = shipped["webhooks"]
    assert webhook["clientConfig"]["service"] == {
        "name": "gpus-tessera-webhook",
        "namespace": "gpu-system",
        "path": "/mutate",
        "port": 443,
    }
    excluded = webhook["namespaceSelector"]["matchExpressions"][0]["values"]
    assert excluded == ["kube-system", "gpu-system"]
    for key in (
        "rules",
        "matchConditions",
        "failurePolicy",
        "timeoutSeconds",
        "sideEffects",
        "reinvocationPolicy",
    ):
        assert webhook[key] == original[key], key
    service = find(objects, "Service", "gpus-tessera-webhook")
    assert {"name": "https", "port": 443, "targetPort": "https", "protocol": "TCP"} in service["spec"][
        "ports"
    ]
    role = find(objects, "ClusterRole", "gpus-tessera-webhook")
    assert role["metadata"]["name"] == "gpus-tessera-webhook"


def test_by_default_the_replicas_keep_the_certificate_and_the_chart_renders_no_key_material(
    default: list[dict[str, Any]],
) -> None:
    args = find(default, "Deployment")["spec"]["template"]["spec"]["containers"][0]["args"]
    for arg in (
        "--tls-secret=tessera-webhook-shared-tls",
        "--namespace=tessera",
        "--webhook-configuration=tessera-webhook",
        "--dns-names=tessera-webhook.tessera.svc",
        f"--certificate-lifetime={365 * 86400}",
        "--renew-fraction=0.67",
        "--rotation-settle=600",
    ):
        assert arg in args
    assert not [a for a in args if a.startswith("--tls-dir")]
    assert not [o for o in default if o["kind"] == "Secret" and "tls" in o["metadata"]["name"]]
    assert "caBundle" not in find(default, "MutatingWebhookConfiguration")["webhooks"][0]["clientConfig"]


def test_helm_template_renders_the_same_tls_objects_twice(home: Path) -> None:
    """GitOps tools render with `helm template`, where `lookup` finds nothing: a render that made key
    material would hand the cluster a new CA at every sync."""

    def tls_objects(folder: str) -> str:
        objects = render(home / folder)
        kept = [o for o in objects if o["kind"] in ("Secret", "ConfigMap", "MutatingWebhookConfiguration")]
        return yaml.safe_dump_all(kept)

    assert tls_objects("twice-1") == tls_objects("twice-2")


def test_a_short_rotation_phase_is_refused(home: Path) -> None:
    with pytest.raises(HelmError, match=r"settleSeconds \(60\) must be at least twice"):
        render(home / "settle", {"webhook": {"tls": {"secret": {"settleSeconds": 60}}}})


def test_the_chart_made_certificate_is_trusted_by_the_configuration(home: Path) -> None:
    default = render(home / "chart-tls", {"webhook": {"tls": {"source": "chart"}}})
    secret = find(default, "Secret", "tessera-webhook-tls")
    ca = x509.load_pem_x509_certificate(base64.b64decode(secret["data"]["ca.crt"]))
    serving = x509.load_pem_x509_certificate(base64.b64decode(secret["data"]["tls.crt"]))
    bundle = find(default, "MutatingWebhookConfiguration")["webhooks"][0]["clientConfig"]["caBundle"]
    assert base64.b64decode(bundle) == base64.b64decode(secret["data"]["ca.crt"])
    serving.verify_directly_issued_by(ca)
    names = serving.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert "tessera-webhook.tessera.svc" in names.get_values_for_type(x509.DNSName)
    assert serving.not_valid_after_utc > datetime.datetime.now(datetime.UTC) + datetime.timedelta(days=365)
    pod = find(default, "Deployment")["spec"]["template"]["spec"]
    assert "--tls-dir=/etc/tessera-webhook/tls" in pod["containers"][0]["args"]
    assert {"name": "tls", "secret": {"secretName": secret["metadata"]["name"]}} in pod["volumes"]


def test_cert_manager_issues_the_certificate_and_injects_the_ca(home: Path) -> None:
    objects = render(home / "cert-manager", {"webhook": {"tls": {"source": "certManager"}}})
    # No Secret: cert-manager makes the serving one, the webhook the API server's client certificate.
    assert [o["metadata"]["name"] for o in objects if o["kind"] == "Secret"] == []
    certificate = find(objects, "Certificate")
    assert certificate["spec"]["secretName"] == "tessera-webhook-tls"
    assert "tessera-webhook.tessera.svc" in certificate["spec"]["dnsNames"]
    issuer = find(objects, "Issuer")
    assert certificate["spec"]["issuerRef"]["name"] == issuer["metadata"]["name"]
    configuration = find(objects, "MutatingWebhookConfiguration")
    assert configuration["metadata"]["annotations"] == {
        "cert-manager.io/inject-ca-from": "tessera/tessera-webhook"
    }
    assert "caBundle" not in configuration["webhooks"][0]["clientConfig"]
    existing = render(
        home / "cert-manager-issuer",
        {
            "webhook": {
                "tls": {
                    "source": "certManager",
                    "certManager": {"issuerRef": {"name": "corp", "kind": "ClusterIssuer"}},
                }
            }
        },
    )
    assert "Issuer" not in kinds(existing)
    assert find(existing, "Certificate")["spec"]["issuerRef"] == {"name": "corp", "kind": "ClusterIssuer"}


def test_the_webhooks_own_ca_is_for_one_replica(home: Path) -> None:
    message = refusal(home, {"webhook": {"tls": {"source": "self"}}})
    assert "webhook.replicas" in message and "webhook.tls.source" in message
    objects = render(home / "own-ca", {"webhook": {"tls": {"source": "self"}, "replicas": 1}})
    assert "Certificate" not in kinds(objects)
    assert [o["metadata"]["name"] for o in objects if o["kind"] == "Secret"] == []
    args = find(objects, "Deployment")["spec"]["template"]["spec"]["containers"][0]["args"]
    assert "--dns-names=tessera-webhook.tessera.svc" in args
    assert "--webhook-configuration=tessera-webhook" in args
    assert "caBundle" not in find(objects, "MutatingWebhookConfiguration")["webhooks"][0]["clientConfig"]


# ------------------------------------------------------------------------------------------ metrics


def test_the_exporter_can_use_a_host_port_instead(home: Path) -> None:
    objects = render(
        home / "host-port",
        {
            "exporter": {"hostPort": {"enabled": True}, "service": {"enabled": False}},
            "kubeletPlugin": {"updateStrategy": {"rollingUpdate": {"maxSurge": 0, "maxUnavailable": 1}}},
        },
    )
    ports = exporter_container(objects)["ports"]
    assert {"name": "metrics", "containerPort": 31995, "protocol": "TCP", "hostPort": 31995} in ports
    assert [o for o in objects if o["kind"] == "Service" and "exporter" in o["metadata"]["name"]] == []
    message = refusal(
        home, {"exporter": {"hostPort": {"enabled": True}}, "kubeletPlugin": {"hostNetwork": True}}
    )
    assert "exporter.hostPort.enabled" in message


def test_monitoring_objects_carry_the_shipped_rules_and_dashboard(home: Path) -> None:
    objects = render(
        home / "monitoring",
        {
            "exporter": {
                "podMonitor": {"enabled": True},
                "prometheusRule": {"enabled": True},
                "dashboard": {"enabled": True},
            }
        },
    )
    rule = find(objects, "PrometheusRule")
    assert rule["spec"] == yaml.safe_load((FILES / "alert-rules.yaml").read_text())
    assert "{{ $labels.namespace }}" in json.dumps(rule["spec"])  # Prometheus's templates, untouched
    dashboard = find(objects, "ConfigMap")
    assert dashboard["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert json.loads(dashboard["data"]["tessera-gpu.json"]) == json.loads(
        (FILES / "grafana-dashboard.json").read_text()
    )
    monitor = find(objects, "PodMonitor")
    assert (
        monitor["spec"]["selector"]["matchLabels"]
        == find(objects, "DaemonSet", "tessera-exporter")["spec"]["selector"]["matchLabels"]
    )
    assert monitor["spec"]["podMetricsEndpoints"][0]["port"] == "metrics"
    service_monitor = render(home / "service-monitor", {"exporter": {"serviceMonitor": {"enabled": True}}})
    selector = find(service_monitor, "ServiceMonitor")["spec"]["selector"]["matchLabels"]
    labels = find(service_monitor, "Service", "tessera-exporter")["metadata"]["labels"]
    assert selector.items() <= labels.items()
    assert "choose one" in refusal(
        home, {"exporter": {"podMonitor": {"enabled": True}, "serviceMonitor": {"enabled": True}}}
    )


# --------------------------------------------------------------------------------------- helm test


def test_helm_test_runs_a_claim_pod_and_a_hami_pod_outside_the_release_namespace(
    default: list[dict[str, Any]],
) -> None:
    hooks = [o for o in default if o["metadata"].get("annotations", {}).get("helm.sh/hook") == "test"]
    namespace = find(hooks, "Namespace")["metadata"]["name"]
    assert namespace != "tessera"
    pods = {p["metadata"]["name"]: p for p in hooks if p["kind"] == "Pod"}
    assert set(pods) == {"tessera-test-claim", "tessera-test-hami"}
    assert all(p["metadata"]["namespace"] == namespace for p in pods.values())
    template = find(hooks, "ResourceClaimTemplate")
    request = template["spec"]["spec"]["devices"]["requests"][0]["exactly"]
    assert request["deviceClassName"] == "gpu.tessera.dev"
    assert request["capacity"]["requests"] == {"memory": "256Mi", "cores": "10"}
    claim_pod = pods["tessera-test-claim"]["spec"]
    assert claim_pod["resourceClaims"] == [
        {"name": "gpu", "resourceClaimTemplateName": template["metadata"]["name"]}
    ]
    hami = pods["tessera-test-hami"]["spec"]["containers"][0]
    assert hami["resources"]["limits"] == {"nvidia.com/gpumem": 256, "nvidia.com/gpucores": 10}
    assert "TESSERA_LIMITS_FILE" in hami["command"][2]
    for hook in hooks:
        assert "hook-succeeded" in hook["metadata"]["annotations"]["helm.sh/hook-delete-policy"]


def test_a_surge_rollout_that_could_never_place_its_new_pod_is_refused(home: Path) -> None:
    """On the host network the surge pod asks for the health port the old pod holds: the scheduler
    never places it and the rollout stops, so the chart refuses before installing."""
    host_network = {"kubeletPlugin": {"hostNetwork": True}}
    message = refusal(home, host_network)
    assert "kubeletPlugin.updateStrategy.rollingUpdate.maxSurge is 1" in message
    replace_in_turn = {"updateStrategy": {"rollingUpdate": {"maxSurge": 0, "maxUnavailable": 1}}}
    values = {"kubeletPlugin": {"hostNetwork": True, **replace_in_turn}}
    strategy = find(render(home / "in-turn", values), "DaemonSet", "tessera-kubeletplugin")["spec"][
        "updateStrategy"
    ]
    assert strategy["rollingUpdate"] == {"maxSurge": 0, "maxUnavailable": 1}


def test_the_exporters_host_port_leaves_the_plugins_surge_rollout_alone(home: Path) -> None:
    """The exporter is a DaemonSet of its own, replaced in turn (its host port cannot surge), so the
    plugin's pods, which hold no host port, keep their surge rollout."""
    objects = render(home / "exporter-host-port", {"exporter": {"hostPort": {"enabled": True}}})
    plugin = find(objects, "DaemonSet", "tessera-kubeletplugin")["spec"]["updateStrategy"]
    exporter = find(objects, "DaemonSet", "tessera-exporter")["spec"]["updateStrategy"]
    assert plugin["rollingUpdate"]["maxSurge"] == 1
    assert exporter == {"type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": 1}}
