"""The exporter over the simulated driver while NVML hangs on one GPU (its nvml_hang fault, as a
wedged driver hangs): every scrape is answered with the other GPU's series and without the hung
GPU's, the hang is counted, /healthz fails once the call has been hung past the bound (so that the
kubelet would restart the exporter), and when NVML answers again the series and the health return.
The kubelet's restart itself is shown on a real node: tests/e2e/test_chart_api_outage.py."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import replace

import pytest
from kubernetes import client
from prometheus_client.parser import text_string_to_metric_families

from simgpu.config import GpuFaults
from testbed.cluster import LocalCluster
from testbed.driver_node import DriverNode, ensure_device_class
from testbed.polling import poll_until

pytestmark = pytest.mark.integration

RESTART_AFTER = 5


@pytest.fixture
def exporter_node(
    cluster: LocalCluster, kube: client.ApiClient, fake_node: Callable[..., str]
) -> Iterator[DriverNode]:
    """The daemon and its exporter on a kubelet-less node with 2 simulated GPUs, the exporter's
    NVML bounds short."""
    ensure_device_class(kube)
    node = DriverNode(
        cluster,
        fake_node(),
        gpus=2,
        exporter_args=["--nvml-timeout=1", f"--nvml-restart-after={RESTART_AFTER}"],
    )
    node.start()
    try:
        node.wait_published()
        yield node
    finally:
        node.cleanup()


def scrape(node: DriverNode) -> dict[tuple[str, str], float]:
    """(family sample name, device_index or "") -> value, of one scrape."""
    out = {}
    for family in text_string_to_metric_families(node.scrape()):
        for sample in family.samples:
            out[(sample.name, sample.labels.get("device_index", ""))] = sample.value
    return out


def hang_gpu_0(node: DriverNode, hang: bool) -> None:
    gpus = list(node.simgpu.spec.gpus)
    gpus[0] = replace(gpus[0], faults=GpuFaults(nvml_hang=hang))
    node.simgpu.update(replace(node.simgpu.spec, gpus=tuple(gpus)))


def test_a_gpu_whose_nvml_hangs_loses_only_its_series_and_fails_liveness_after_the_bound(
    exporter_node: DriverNode,
) -> None:
    node = exporter_node
    used = "tessera_gpu_memory_used_bytes"
    poll_until(lambda: node.exporter_get("/healthz")[0] == 200, 60, "the exporter serving")
    before = scrape(node)
    assert (used, "0") in before and (used, "1") in before
    assert before[("tessera_exporter_nvml_hung_gpus", "")] == 0

    hang_gpu_0(node, True)
    try:
        hung = poll_until(
            lambda: found if (used, "0") not in (found := scrape(node)) else None,
            60,
            "GPU 0's series left out",
        )
        assert (used, "1") in hung, "the other GPU's series keep coming"
        assert hung[("tessera_gpu_healthy", "0")] == 0 and hung[("tessera_gpu_healthy", "1")] == 1
        assert hung[("tessera_exporter_nvml_hung_gpus", "")] == 1
        for _ in range(3):  # every scrape is answered, none adds a call on the hung GPU
            again = scrape(node)
            assert (used, "1") in again and (used, "0") not in again

        poll_until(lambda: node.exporter_get("/healthz")[0] == 503, 60, "liveness to fail after the bound")
        reason = node.exporter_get("/healthz")[1]
        assert reason.startswith(f"an NVML call has not returned for over {RESTART_AFTER} s on GPU "), reason
        assert node.simgpu.spec.gpus[0].uuid in reason
    finally:
        hang_gpu_0(node, False)

    poll_until(lambda: node.exporter_get("/healthz")[0] == 200, 60, "liveness back once NVML answers")
    poll_until(lambda: (used, "0") in scrape(node), 60, "GPU 0's series back")
    assert scrape(node)[("tessera_exporter_nvml_hung_gpus", "")] == 0
