"""The test bed's bound on live kubelets: a factory asked for more nodes than the bound allows,
counting those other factories of the process still hold, refuses before it starts any."""

from __future__ import annotations

from typing import cast

import pytest

from testbed import node
from testbed.cluster import LocalCluster


def test_a_start_past_the_bound_is_refused_before_any_node_starts(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(node, "MAX_LIVE_NODES", 1)
    monkeypatch.setattr(node, "_live_nodes", set())  # whatever nodes this session's tests hold
    factory = node.NodeFactory(cast(LocalCluster, None))  # refused before the cluster is ever used
    with pytest.raises(
        RuntimeError, match=r"would make 2 kubelets in this process, over the test bed's bound of 1"
    ):
        factory.start(2)
    assert factory.nodes == []
