"""Fixtures for the simulated-driver tests: a built simgpu and simulated nodes."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from simgpu.config import GiB, NodeSpec, make_gpus, write_config
from simgpu.node import Node, NodeFactory
from testbed.shim_harness import build_simgpu


@pytest.fixture(scope="session", autouse=True)
def built() -> None:
    """The libraries and test programs, built by the project's build exactly as CI builds them."""
    build_simgpu()


@pytest.fixture
def make_node(tmp_path: Path) -> NodeFactory:
    """Factory: ``make_node(gpus=2, name="a", memory_bytes=..., **node_fields)``."""

    def factory(gpus: int = 1, name: str = "node0", memory_bytes: int = GiB, **fields: object) -> Node:
        base = tmp_path / name
        spec = NodeSpec(state_file=base / "state", gpus=make_gpus(gpus, name, memory_bytes=memory_bytes))
        spec = replace(spec, **fields)  # type: ignore[arg-type]
        return Node(spec, write_config(spec, base / "simgpu.conf"))

    return factory
