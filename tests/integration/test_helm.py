"""The Go-built Helm talks to the local cluster, and its kubeVersion check sees the stamped version."""

from __future__ import annotations

from pathlib import Path

import pytest

from testbed.cluster import LocalCluster
from testbed.versions import version_of
from tests.chart_helm import helm

pytestmark = pytest.mark.integration


def write_chart(root: Path, kube_version: str) -> Path:
    chart = root / "probe"
    (chart / "templates").mkdir(parents=True)
    (chart / "Chart.yaml").write_text(
        f"apiVersion: v2\nname: probe\nversion: 0.1.0\nkubeVersion: '{kube_version}'\n"
    )
    (chart / "templates" / "configmap.yaml").write_text(
        "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: probe\n"
        "data:\n  kube: {{ .Capabilities.KubeVersion.Version | quote }}\n"
    )
    return chart


def test_chart_requiring_this_kubernetes_installs(
    cluster: LocalCluster, namespace: str, tmp_path: Path
) -> None:
    """A chart that needs >= the pinned minor installs, and sees the cluster's real version."""
    pinned = version_of("KUBERNETES_VERSION")
    minor = pinned.split(".")[1]
    chart = write_chart(tmp_path, f">= 1.{minor}.0-0")
    kubeconfig = cluster.admin_kubeconfig
    helm(
        tmp_path,
        "install",
        "probe",
        str(chart),
        "-n",
        namespace,
        "--wait",
        "--timeout",
        "60s",
        kubeconfig=kubeconfig,
    )
    rendered = helm(tmp_path, "get", "manifest", "probe", "-n", namespace, kubeconfig=kubeconfig)
    assert f'kube: "{pinned}"' in rendered.stdout


def test_chart_requiring_a_newer_kubernetes_is_refused(
    cluster: LocalCluster, namespace: str, tmp_path: Path
) -> None:
    """Helm compares kubeVersion with the server's /version, so an unstamped v0.0.0 would fail here."""
    chart = write_chart(tmp_path, ">= 1.99.0-0")
    result = helm(
        tmp_path,
        "install",
        "probe",
        str(chart),
        "-n",
        namespace,
        kubeconfig=cluster.admin_kubeconfig,
        check=False,
    )
    assert result.returncode != 0
    assert "is incompatible with Kubernetes" in result.stderr
