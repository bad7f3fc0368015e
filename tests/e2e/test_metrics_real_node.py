"""GPU metrics on a real node, read through a real Prometheus: the kubelet prepares the share, the
container's CUDA program allocates through the shim, and the node daemon's exporter on the node's
own address at :31995 reports it with the pod's labels — within one scrape of each change. A
compute-capped container's utilisation, and the shipped memory alert, are read the same way.

"Within one scrape" is a scrape number, not a stopwatch: the exporter counts each scrape as it
starts; the test reads the count once the container's log shows the change, and Prometheus's next
scrape of the node must already show it.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from kubernetes import client
from prometheus_client.parser import text_string_to_metric_families

from tessera.names import METRICS_PORT
from tessera.quantity import GiB
from testbed.cluster import LocalCluster
from testbed.driver_node import DriverNode, ensure_device_class
from testbed.node import NodeFactory
from testbed.polling import poll_until
from testbed.prometheus import TEST_HOLD, Prometheus, Sample
from tests.e2e.test_driver_node import GpuNode, probe_image, run_share_pod

pytestmark = pytest.mark.e2e

__all__ = ["probe_image"]  # a fixture this module uses

USED = "tessera_container_gpu_memory_used_bytes"
LIMIT = "tessera_container_gpu_memory_limit_bytes"


@pytest.fixture(scope="module")
def metrics_node(
    cluster: LocalCluster, kube: client.ApiClient, node_factory: NodeFactory, probe_image: Path
) -> Iterator[tuple[GpuNode, Prometheus]]:
    """One real node, its daemon's exporter on the node's own address at :31995 (as the DaemonSet
    on the host network), and Prometheus scraping it."""
    ensure_device_class(kube)
    (node,) = node_factory.start(1, extra_images=[probe_image])
    driver = DriverNode(
        cluster,
        node.name,
        kubelet_root=node.paths.kubelet_root,
        cdi_dir=node.paths.cdi_dir,
        gpus=2,
        metrics_address=node.address,
        metrics_port=METRICS_PORT,
    )
    prometheus: Prometheus | None = None
    try:
        driver.start()
        driver.wait_ready()
        prometheus = Prometheus([f"{node.address}:{METRICS_PORT}"], hold=TEST_HOLD)
        yield GpuNode(node, driver), prometheus
    finally:
        if prometheus is not None:
            prometheus.stop()
        driver.cleanup()


def scrape_number(driver: DriverNode) -> int:
    for family in text_string_to_metric_families(driver.scrape()):
        for s in family.samples:
            if s.name == "tessera_exporter_scrapes_total":
                return int(s.value)
    raise AssertionError("no tessera_exporter_scrapes_total")


def at_scrape(prometheus: Prometheus, node: GpuNode, expr: str, scrape: int) -> list[Sample]:
    """``expr`` as stored from the exporter's scrape number ``scrape`` (possibly no series)."""

    def made() -> tuple[list[Sample]] | None:
        found = prometheus.series_at_scrape(expr, node.name, scrape)
        return None if found is None else (found,)

    return poll_until(made, 60, f"Prometheus's scrape {scrape}")[0]


def wait_log(kube: client.ApiClient, namespace: str, pod: str, text: str, count: int = 1) -> None:
    core = client.CoreV1Api(kube)
    poll_until(
        lambda: str(core.read_namespaced_pod_log(pod, namespace)).count(text) >= count,
        180,
        f"{pod} to print {text!r} {count} time(s)",
    )


def test_a_containers_allocation_shows_with_its_labels_within_one_scrape_and_goes_with_its_process(
    metrics_node: tuple[GpuNode, Prometheus], kube: client.ApiClient, namespace: str
) -> None:
    node, prometheus = metrics_node
    nbytes = 3 * GiB
    # Holds 3 GiB for 30 s (the probe frees when its stdin closes), holds nothing for 30 s, then
    # holds 3 GiB again until SIGKILL.
    script = (
        f"sleep 30 | shim_probe alloc mem {nbytes} hold; echo '== freed'; sleep 30; "
        f"sleep 3600 | shim_probe alloc mem {nbytes} hold & p=$!; sleep 30; kill -9 $p; echo '== killed'; "
        "exec sleep 3600"
    )
    run_share_pod(kube, namespace, node, "m", [{"memory": "8Gi", "cores": "30"}], script, wait=False)
    selector = f'{{namespace="{namespace}", pod="m", container="probe"}}'

    wait_log(kube, namespace, "m", "HOLD")
    n = scrape_number(node.driver)
    (used,) = at_scrape(prometheus, node, USED + selector, n + 1)
    (limit,) = at_scrape(prometheus, node, LIMIT + selector, n + 1)
    assert used.value == nbytes
    assert limit.value == 8 * GiB
    uuid = used.labels["device_uuid"]
    index = [g.uuid for g in node.driver.simgpu.spec.gpus].index(uuid)
    assert used.labels["node"] == node.name
    assert used.labels["device_index"] == str(index)
    assert used.labels["claim"].startswith("m-gpu-")
    assert limit.labels == {**used.labels, "__name__": LIMIT}

    wait_log(kube, namespace, "m", "== freed")
    n = scrape_number(node.driver)
    assert at_scrape(prometheus, node, USED + selector, n + 1)[0].value == 0

    wait_log(kube, namespace, "m", "HOLD", count=2)
    n = scrape_number(node.driver)
    assert at_scrape(prometheus, node, USED + selector, n + 1)[0].value == nbytes
    wait_log(kube, namespace, "m", "== killed")
    n = scrape_number(node.driver)
    assert at_scrape(prometheus, node, USED + selector, n + 2)[0].value == 0

    client.CoreV1Api(kube).delete_namespaced_pod("m", namespace, grace_period_seconds=0)

    def gone() -> bool:
        n = scrape_number(node.driver)
        return at_scrape(prometheus, node, USED + selector, n + 1) == []

    poll_until(gone, 120, "the deleted pod's series gone")


def test_a_capped_containers_utilisation_matches_the_simulated_gpus_own_figure(
    metrics_node: tuple[GpuNode, Prometheus], kube: client.ApiClient, namespace: str
) -> None:
    node, prometheus = metrics_node
    # 2 ms kernels for 40 s, four in flight, under a 30 % cap: the cap sets the share.
    script = "shim_probe duty 2000000 40 4; echo '== ran'; exec sleep 3600"
    run_share_pod(kube, namespace, node, "u", [{"memory": "1Gi", "cores": "30"}], script, wait=False)
    selector = f'{{namespace="{namespace}", pod="u", container="probe"}}'

    def busy_scrape() -> tuple[float, float] | None:
        n = scrape_number(node.driver)
        ours = at_scrape(prometheus, node, "tessera_container_gpu_utilization_ratio" + selector, n + 1)
        if not ours:
            return None
        gpu = f'{{device_uuid="{ours[0].labels["device_uuid"]}"}}'
        simulated = at_scrape(prometheus, node, "tessera_gpu_utilization_ratio" + gpu, n + 1)
        if not simulated or simulated[0].value < 0.2:
            return None  # the workload has not filled NVML's sample window yet
        return ours[0].value, simulated[0].value

    ours, simulated = poll_until(busy_scrape, 120, "a scrape while the capped workload runs")
    # With this claim the GPU's only user, the device's figure is the simulated driver's own count
    # of busy time; the container's comes from the samples of the processes that map its region.
    assert abs(ours - simulated) <= 0.03, (ours, simulated)
    assert ours <= 0.33, ours


def test_a_container_past_90_percent_of_its_memory_limit_fires_the_shipped_alert(
    metrics_node: tuple[GpuNode, Prometheus], kube: client.ApiClient, namespace: str
) -> None:
    node, prometheus = metrics_node
    script = f"sleep 3600 | shim_probe alloc mem {950 * 1024 * 1024} hold"
    run_share_pod(kube, namespace, node, "a", [{"memory": "1Gi"}], script, wait=False)

    def firing() -> dict[str, str] | None:
        for alert in prometheus.alerts():
            labels = alert["labels"]
            if (
                labels["alertname"] == "TesseraContainerGpuMemoryNearLimit"
                and labels.get("namespace") == namespace
            ):
                return dict(labels) if alert["state"] == "firing" else None
        return None

    # The rule's `for:` (TEST_HOLD here; promtool checks the shipped minute) keeps it pending first.
    labels = poll_until(firing, 240, "TesseraContainerGpuMemoryNearLimit firing", interval=1.0)
    assert (labels["pod"], labels["container"], labels["node"]) == ("a", "probe", node.name)
