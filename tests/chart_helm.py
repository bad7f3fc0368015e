"""The one way tests run Helm on charts/tessera: the Go-built Helm of the test bed, its caches kept in
a folder of the test's own, rendering (no cluster) or talking to the local control plane.

Shared by the chart's unit tests (``helm lint``/``helm template``) and its integration tests
(``helm install``/``uninstall`` into :class:`~tessera.testbed.cluster.LocalCluster`).
"""

from __future__ import annotations

import contextlib
import os
import subprocess
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from kubernetes import client

from tessera.testbed.binaries import binary, ensure_built
from tessera.testbed.cluster import LocalCluster
from tessera.testbed.names import unique_name
from tessera.testbed.versions import version_of

REPO = Path(__file__).resolve().parent.parent
CHART = REPO / "charts" / "tessera"


class HelmError(AssertionError):
    """Helm exited non-zero; the message holds the command and its stderr."""


def helm(
    home: Path, *args: str, kubeconfig: Path | None = None, check: bool = True, timeout: float = 300
) -> subprocess.CompletedProcess[str]:
    """Run ``helm args...`` with its cache, config and data under ``home`` (and ``kubeconfig``, if
    given); with ``check``, a non-zero exit raises :class:`HelmError` naming the command."""
    ensure_built("helm")
    env = {
        **os.environ,
        "HELM_CACHE_HOME": str(home / "cache"),
        "HELM_CONFIG_HOME": str(home / "config"),
        "HELM_DATA_HOME": str(home / "data"),
    }
    env.pop("KUBECONFIG", None)
    if kubeconfig is not None:
        env["KUBECONFIG"] = str(kubeconfig)
    result = subprocess.run(
        [str(binary("helm")), *args], env=env, capture_output=True, text=True, timeout=timeout
    )
    if check and result.returncode != 0:
        raise HelmError(f"helm {' '.join(args)} exited {result.returncode}:\n{result.stderr}")
    return result


def values_file(home: Path, values: Mapping[str, Any], name: str = "values.yaml") -> Path:
    """``values`` written as a values file under ``home`` (for ``-f``)."""
    home.mkdir(parents=True, exist_ok=True)
    path = home / name
    path.write_text(yaml.safe_dump(dict(values)))
    return path


def kube_version() -> str:
    """The test bed's Kubernetes version, for ``helm template --kube-version``."""
    return version_of("KUBERNETES_VERSION").lstrip("v")


def render(
    home: Path,
    values: Mapping[str, Any] | None = None,
    release: str = "tessera",
    namespace: str = "tessera",
    extra: Sequence[str] = (),
) -> list[dict[str, Any]]:
    """``helm template`` of the chart with ``values``: every object it renders (test hooks
    included), parsed."""
    args = ["template", release, str(CHART), "-n", namespace, "--kube-version", kube_version()]
    if values:
        args += ["-f", str(values_file(home, values))]
    result = helm(home, *args, *extra)
    return [doc for doc in yaml.safe_load_all(result.stdout) if doc]


def find(objects: Sequence[Mapping[str, Any]], kind: str, name: str | None = None) -> dict[str, Any]:
    """The one object of ``kind`` (and ``name``, if given) among ``objects``."""
    matches = [
        dict(o) for o in objects if o["kind"] == kind and (name is None or o["metadata"]["name"] == name)
    ]
    assert len(matches) == 1, f"{len(matches)} objects of kind {kind} named {name}: {matches}"
    return matches[0]


def kinds(objects: Sequence[Mapping[str, Any]]) -> set[str]:
    return {o["kind"] for o in objects}


@dataclass(frozen=True)
class Release:
    """An installed release; its release name contains "tessera", so its objects are named
    "<release>-<component>"."""

    name: str
    namespace: str

    def object_name(self, component: str) -> str:
        return f"{self.name}-{component}"


@contextlib.contextmanager
def installed(
    cluster: LocalCluster, kube: client.ApiClient, home: Path, values: Mapping[str, Any]
) -> Iterator[Release]:
    """A release of the chart with ``values`` in a namespace of its own; uninstalled (and the
    namespace deleted) afterwards."""
    release = Release(unique_name("tessera"), unique_name("tessera-ns"))
    core = client.CoreV1Api(kube)
    core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=release.namespace)))
    try:
        args = ["-n", release.namespace, "-f", str(values_file(home, values))]
        helm(home, "install", release.name, str(CHART), *args, kubeconfig=cluster.admin_kubeconfig)
        try:
            yield release
        finally:
            helm(
                home, "uninstall", release.name, "-n", release.namespace, kubeconfig=cluster.admin_kubeconfig
            )
    finally:
        core.delete_namespace(release.namespace)
