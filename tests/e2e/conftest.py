"""Fixtures for end-to-end tests: real nodes (containerd + kubelet) registered with the session's
local control plane.

Nodes are session-scoped, like the cluster: one starts in about a second once the binaries are
cached, but every test works in its own namespace and pins its pods to a node by name, so sharing
costs nothing. Everything a node took (pods, containers, mounts, cgroups, bridge, folder) is given
back when the session ends, whether tests failed or not; a run killed outright is cleaned by the next
one (sweep_stale_nodes). When a test that used nodes fails, the tail of each node's containerd and
kubelet log is attached to its report (by the hook in tests/conftest.py).
"""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

from testbed.cluster import LocalCluster
from testbed.node import NodeFactory, RealNode
from testbed.node_runtime import NodeRuntime


@pytest.fixture(scope="session")
def node_factory(cluster: LocalCluster) -> Iterator[NodeFactory]:
    """Starts nodes on demand (``node_factory.start(count)``); stops and cleans all of them at the end."""
    if os.geteuid() != 0:
        pytest.skip("real nodes need root: containerd and the kubelet mount, and manage cgroups and links")
    factory = NodeFactory(cluster)
    yield factory
    factory.stop_all()


@pytest.fixture(scope="session")
def real_node(node_factory: NodeFactory) -> RealNode:
    """One Ready node shared by the session's tests."""
    return node_factory.start(1)[0]


@pytest.fixture(scope="session")
def node_runtime(node_factory: NodeFactory) -> NodeRuntime:
    """A node's containerd without a kubelet, for tests that create containers through the CRI
    (a kubelet terminates every pod sandbox it did not create)."""
    return node_factory.start_runtime()
