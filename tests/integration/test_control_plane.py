"""The local control plane is the real thing, at the pinned version, with the DRA features on."""

from __future__ import annotations

import re

import pytest
from kubernetes import client

from testbed.cluster import LocalCluster
from testbed.versions import version_of

pytestmark = pytest.mark.integration

COMPONENTS = ("kube-apiserver", "kube-scheduler", "kube-controller-manager")


def test_api_server_reports_the_pinned_kubernetes_version(kube: client.ApiClient) -> None:
    """/version carries the version stamped at build time, which Helm's kubeVersion checks read."""
    info = client.VersionApi(kube).get_code()
    assert info.git_version == version_of("KUBERNETES_VERSION")
    assert info.major == "1"


@pytest.mark.parametrize("component", COMPONENTS)
@pytest.mark.parametrize("gate", ["DynamicResourceAllocation", "DRAConsumableCapacity"])
def test_dra_feature_gate_is_enabled(cluster: LocalCluster, component: str, gate: str) -> None:
    """Every component that takes part in allocation runs with the gate on (its /metrics says so)."""
    metrics = cluster.component_metrics(component)
    pattern = rf'^kubernetes_feature_enabled\{{name="{gate}",stage="[A-Z]*"\}} (\d)$'
    found = re.search(pattern, metrics, re.MULTILINE)
    assert found, f"{component} does not report feature gate {gate}"
    assert found.group(1) == "1", f"{component} runs with {gate} off"


def test_resource_v1_api_is_served(kube: client.ApiClient) -> None:
    """resource.k8s.io/v1 is served without any --runtime-config flag."""
    versions = client.ApisApi(kube).get_api_versions()
    group = next(g for g in versions.groups if g.name == "resource.k8s.io")
    assert "v1" in [v.version for v in group.versions]
