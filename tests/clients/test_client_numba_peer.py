"""numba-cuda's own tests, a peer suite nobody here wrote, hold the shim to one rule: every test of
the selection (numba_peer.toml) that passes on the simulated driver without the shim passes under
it - uncapped, with a memory limit, and with a compute cap. Outcomes are compared test by test, so
the rule holds whatever the simulator can do today: a test that fails without the shim (a kernel
whose result is checked: the simulated GPU computes nothing) is outside it, and one that starts
passing when the simulator grows comes under it on its own. Run with each line of clients."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from simgpu.config import GiB
from testbed import peer_suite
from testbed.shim_harness import PROGRAM_BUILD, SIMGPU_BUILD, claim_on, simulated_node
from tests.clients.client_lines import ClientLine

SELECTION = Path(__file__).with_name("numba_peer.toml")
GPUS = 2  # test_multigpu and test_select_device need a second device
GPU_MEMORY = 4 * GiB  # test_managed_alloc fills a tenth of it, through the host: more is slower
CLAIMS = {
    "no limit": (None, 0),
    "memory limit": (GiB, 0),
    "compute cap": (None, 30),
}
"""Each claim's limits on every GPU of the node: (memory bytes or None, cores %)."""
PROCESS_TIMEOUT_S = 300
"""How long one process of the client may run its share of the modules before it counts as hung
(the modules after the test it hung in then run in a fresh process)."""
PROBE = """
from numba import cuda
print(cuda.current_context().get_memory_info().total)
print(any("libtessera-cuda.so" in line for line in open("/proc/self/maps")))
"""
"""What shows that a claim reaches numba: the shim in the process, and the memory numba sees."""


class PeerNode:
    """A simulated node for one line of clients, and how the selection runs on it."""

    def __init__(self, line: ClientLine, directory: Path) -> None:
        self.python = line.python
        self.directory = directory
        self.uuids, self.env = simulated_node(directory / "node", GPUS, GPU_MEMORY, **line.node)
        self.modules = peer_suite.load_selection(SELECTION).modules

    def run(self, env: dict[str, str], name: str) -> peer_suite.Run:
        cwd = self.directory / name
        cwd.mkdir()
        return peer_suite.run_selection(
            self.python, self.modules, env, peer_suite.default_jobs(), PROCESS_TIMEOUT_S, cwd
        )


@pytest.fixture(scope="module")
def node(line: ClientLine, tmp_path_factory: pytest.TempPathFactory) -> PeerNode:
    return PeerNode(line, tmp_path_factory.mktemp(f"numba-peer-{line.name}"))


@pytest.fixture(scope="module")
def without_shim(node: PeerNode) -> peer_suite.Run:
    return node.run(node.env, "without-shim")


@pytest.mark.timeout(1200)
@pytest.mark.parametrize("claim", CLAIMS)
def test_every_numba_test_that_passes_without_the_shim_passes_under_it(
    node: PeerNode, without_shim: peer_suite.Run, claim: str
) -> None:
    memory, cores = CLAIMS[claim]
    directory = node.directory / claim.replace(" ", "-")
    limits = [(uuid, memory, cores) for uuid in node.uuids]
    cuda, nvml = SIMGPU_BUILD / "libcuda.so.1", SIMGPU_BUILD / "libnvidia-ml.so.1"
    under = claim_on(directory, node.env, limits, cuda, nvml, PROGRAM_BUILD).env()
    probe = subprocess.run(
        [str(node.python), "-c", PROBE], env=under, capture_output=True, text=True, timeout=120
    )
    assert probe.stdout.split() == [str(memory or GPU_MEMORY), "True"], probe.stderr
    with_shim = node.run(under, f"{directory.name}-run")
    print(f"without the shim: {peer_suite.counts(without_shim)}; {claim}: {peer_suite.counts(with_shim)}")
    passed = peer_suite.counts(without_shim).get(peer_suite.PASSED, 0)
    assert passed > 0, f"no test passed without the shim, so the rule tests nothing: {without_shim}"
    lost = peer_suite.regressions(without_shim, with_shim)
    assert not lost, f"{len(lost)} of the {passed} tests that pass without the shim fail under a claim " + (
        f"with {claim}:\n\n" + "\n\n".join(str(r) for r in lost)
    )
