"""Where the test bed's third-party binaries live, and building them when they are missing.

Binaries are cached outside the repository, keyed by component and version (see build-binaries.sh),
so a warm machine starts clusters in seconds and a version bump rebuilds only what changed.
"""

from __future__ import annotations

import os
import subprocess
from dataclasses import dataclass
from pathlib import Path

from testbed.versions import version_of

BUILD_SCRIPT = Path(__file__).with_name("build-binaries.sh")


def cache_root() -> Path:
    """The cache folder: $TESSERA_CACHE, else ~/.cache/tessera (the build script uses the same rule)."""
    configured = os.environ.get("TESSERA_CACHE")
    return Path(configured) if configured else Path.home() / ".cache" / "tessera"


@dataclass(frozen=True)
class Component:
    """A group of binaries built together at one pinned version."""

    name: str
    version_key: str
    binaries: tuple[str, ...]

    @property
    def directory(self) -> Path:
        return cache_root() / "bin" / f"{self.name}-{version_of(self.version_key)}"

    def missing(self) -> list[str]:
        return [b for b in self.binaries if not os.access(self.directory / b, os.X_OK)]


COMPONENTS: dict[str, Component] = {
    c.name: c
    for c in (
        Component(
            "kubernetes",
            "KUBERNETES_VERSION",
            ("kube-apiserver", "kube-controller-manager", "kube-scheduler", "kubectl", "kubelet"),
        ),
        Component("etcd", "ETCD_VERSION", ("etcd",)),
        Component("helm", "HELM_VERSION", ("helm",)),
        Component("containerd", "CONTAINERD_VERSION", ("containerd", "containerd-shim-runc-v2", "ctr")),
        Component("runc", "RUNC_VERSION", ("runc",)),
        Component("cri-tools", "CRI_TOOLS_VERSION", ("crictl",)),
        Component("cni-plugins", "CNI_PLUGINS_VERSION", ("bridge", "host-local")),
        Component("prometheus", "PROMETHEUS_VERSION", ("prometheus", "promtool")),
        Component("kueue", "KUEUE_VERSION", ("kueue",)),
    )
}


def ensure_built(*names: str) -> None:
    """Build the named components (all when none is named) that are missing or stale.

    The build script alone decides what is up to date (it also rebuilds a cached runc that lacks
    seccomp), so this always asks it; for cached components that takes well under a second."""
    unknown = [n for n in names if n not in COMPONENTS]
    if unknown:
        raise KeyError(f"unknown test-bed components {unknown}; known: {sorted(COMPONENTS)}")
    subprocess.run(["bash", str(BUILD_SCRIPT), *names], check=True)


def binary(name: str) -> Path:
    """The path of one cached binary; raises with the command that builds it when it is missing."""
    for component in COMPONENTS.values():
        if name in component.binaries:
            path = component.directory / name
            if not os.access(path, os.X_OK):
                raise FileNotFoundError(f"{path} is not built; run: bash {BUILD_SCRIPT} {component.name}")
            return path
    raise KeyError(f"no test-bed component provides a binary named {name!r}")
