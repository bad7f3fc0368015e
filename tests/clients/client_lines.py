"""The two lines of NVIDIA's Python CUDA clients the real-client tier runs, and how a claim's process
runs one of the tier's client programs (programs/) with either.

The CUDA 12 line is the development environment's own (dev/pyproject.toml: cuda-bindings 12,
cuda-core, numba-cuda[cu12]); the CUDA 13 line is .venv-cuda13 (dev/clients-cuda13, built by
`make clients-cuda13`, which `make test` and `make unit` run first)."""

from __future__ import annotations

import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from testbed.shim_harness import REPO, Claim, ClaimProcess

PROGRAMS = Path(__file__).parent / "programs"


@dataclass(frozen=True)
class ClientLine:
    """One line of NVIDIA's Python CUDA clients: the interpreter whose environment holds it, and
    the simulated node's driver versions it is run on (a driver of its CUDA generation)."""

    name: str
    python: Path
    node: Mapping[str, object]
    """simgpu.config.NodeSpec fields, passed on to ``make_claim``."""

    def argv(self, program: str, *args: str) -> list[str]:
        """The command that runs one of this tier's client programs with this line."""
        return [str(self.python), str(PROGRAMS / program), *args]

    def process(self, claim: Claim, api: str, env: Mapping[str, str] | None = None) -> ClaimProcess:
        """A process of ``claim`` that allocates through ``api`` when told to (programs/client.py)."""
        return ClaimProcess(claim, self.argv("client.py", api), env)


LINES: Sequence[ClientLine] = (
    # The simulator's default node: a 550 driver, CUDA 12.4.
    ClientLine("cuda12", Path(sys.executable), {}),
    # A 580 driver, CUDA 13.0: what CUDA 13 clients need (cuda-bindings 13 resolves the 13.0 ABIs).
    ClientLine(
        "cuda13",
        REPO / ".venv-cuda13" / "bin" / "python",
        {"driver_version": "580.65.06", "cuda_driver_version": 13000},
    ),
)
