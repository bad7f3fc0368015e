"""The one way tests run Helm on charts/tessera: the Go-built Helm of the test bed, its caches kept in
a folder of the test's own, rendering (no cluster) or talking to the local control plane.

Shared by the chart's unit tests (``helm lint``/``helm template``) and its integration tests
(``helm install``/``uninstall`` into :class:`~testbed.cluster.LocalCluster`).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from kubernetes import client

from testbed.cluster import LocalCluster
from testbed.helm import CHART, REPO, HelmError, helm, values_file
from testbed.names import unique_name
from testbed.versions import version_of

__all__ = ["CHART", "REPO", "HelmError", "Release", "helm", "installed", "render", "values_file"]


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
