"""Fixtures for end-to-end tests: real nodes (containerd + kubelet) registered with the session's
local control plane.

A module's nodes are its own: ``node_factory`` is module-scoped and gives back everything its
nodes took (pods, containers, mounts, cgroups, bridge, folder) when the module ends, whether tests
failed or not, so at most the nodes of the running module and the session's one shared node are
alive at a time (the test bed refuses more than ``testbed.node.MAX_LIVE_NODES``). Every test works
in its own namespace and pins its pods to a node by name, so sharing the one node costs nothing. A
run killed outright is cleaned by the next one (sweep_stale_nodes). When a test that used nodes
fails, the tail of each node's containerd and kubelet log is attached to its report (by the hook in
tests/conftest.py).
"""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

from testbed.cluster import LocalCluster
from testbed.node import NodeFactory, RealNode
from testbed.node_runtime import NodeRuntime


def _factory(cluster: LocalCluster) -> Iterator[NodeFactory]:
    if os.geteuid() != 0:
        pytest.skip("real nodes need root: containerd and the kubelet mount, and manage cgroups and links")
    factory = NodeFactory(cluster)
    yield factory
    factory.stop_all()


@pytest.fixture(scope="module")
def node_factory(cluster: LocalCluster) -> Iterator[NodeFactory]:
    """Starts nodes on demand (``node_factory.start(count)``); stops and cleans all of them when the
    module ends."""
    yield from _factory(cluster)


@pytest.fixture(scope="session")
def session_node_factory(cluster: LocalCluster) -> Iterator[NodeFactory]:
    """The factory of what the whole session shares: one node and one kubelet-less runtime."""
    yield from _factory(cluster)


@pytest.fixture(scope="session")
def real_node(session_node_factory: NodeFactory) -> RealNode:
    """One Ready node shared by the session's tests."""
    return session_node_factory.start(1)[0]


@pytest.fixture(scope="session")
def node_runtime(session_node_factory: NodeFactory) -> NodeRuntime:
    """A node's containerd without a kubelet, for tests that create containers through the CRI
    (a kubelet terminates every pod sandbox it did not create)."""
    return session_node_factory.start_runtime()
