"""Where the plugin reads an exporter: the pod proxy is asked for the port's number, never its name
(kube-apiserver 1.37 panics on a named pod port; tests/e2e/test_chart_node.py reads the figures
through the real proxy)."""

from __future__ import annotations

from typing import Any

from tessera.kubectl import usage
from tessera.kubectl.usage import metrics_port


def exporter_pod(*ports: dict[str, Any]) -> dict[str, Any]:
    return {"spec": {"containers": [{"name": "exporter", "ports": list(ports)}]}}


def test_the_metrics_port_is_found_by_name_and_given_by_number() -> None:
    pod = exporter_pod(
        {"name": "exporter-health", "containerPort": 51516}, {"name": "metrics", "containerPort": 31995}
    )
    assert metrics_port(pod) == 31995


def test_a_pod_without_a_numbered_metrics_port_has_none() -> None:
    assert metrics_port(exporter_pod({"name": "other", "containerPort": 1})) is None
    assert metrics_port(exporter_pod({"name": "metrics", "containerPort": "31995"})) is None
    assert metrics_port({"metadata": {}}) is None


def test_the_exporters_namespace_is_the_one_helm_recorded_on_the_charts_device_class() -> None:
    made_by_helm = {"metadata": {"annotations": {"meta.helm.sh/release-namespace": "tessera"}}}
    assert usage.release_namespace(made_by_helm) == "tessera"
    assert usage.release_namespace({"metadata": {"name": "gpu.tessera.dev"}}) is None, "not Helm's"
    assert (
        usage.release_namespace({"metadata": {"annotations": {"meta.helm.sh/release-namespace": ""}}}) is None
    )
