"""The chart on real nodes while a dependency fails around it, with GPU pods running on shares.

The API server gone for a minute: the node daemon's pods stay up, never restarted (their liveness
does not depend on the API), and say they are not ready and why; the running container keeps its
limits and its metrics; once the server is back the daemons are ready again, and a new GPU pod is
placed, prepared and runs with its share.

NVML hanging on one GPU of a node (the simulated driver's nvml_hang, as a wedged driver hangs):
every GPU of that node is tainted unmonitored, so a GPU pod created meanwhile lands on the other
node; the daemon says why it is not ready and stays alive; when NVML answers again the taints go,
and the running pod kept its container and its limits throughout. The exporter beside it, which
asks NVML about each GPU under a watchdog, keeps serving the other GPU's series, and once the call
has been hung past its bound its liveness fails and the kubelet restarts the exporter container,
never the plugin's; the restarted exporter, finding the GPU still hung, serves the other GPU
without it and stays live, and once NVML answers the GPU's series come back without another restart.

It stops the API server, so it runs on a control plane and nodes of its own, not the session's.
tests/integration/test_driver_outages.py holds the same outage, and a black hole to the API server,
against the daemon alone, with the kubelet's calls made by the test.
"""

from __future__ import annotations

import json
import os
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from functools import partial

import pytest
from kubernetes import client
from prometheus_client.parser import text_string_to_metric_families

from simgpu.config import GpuFaults
from tessera.kube import api_client, raw_json
from tessera.names import UNMONITORED_TAINT
from testbed import chart_bed as charts
from testbed.chart_bed import (
    DAEMON_HEALTH_PORT,
    ROLLOUT_TIMEOUT,
    ChartBed,
    enforcement_script,
    scrape,
    wait_rolled_out,
)
from testbed.cluster import LocalCluster
from testbed.node import NodeFactory, RealNode
from testbed.pod_state import sections, wait_for_pod
from testbed.pod_stream import HAMI_SHARE, hami_pod, in_metrics, running_with_its_share
from testbed.polling import poll_until
from testbed.product_images import product_images
from tests.conftest import made_namespace

pytestmark = pytest.mark.e2e

OUTAGE_SECONDS = 60
EXPORTER_HEALTH_PORT = 51516
"""The exporter's /healthz and /readyz (exporter.healthPort's default), on its node's address."""
EXPORTER_RESTART_SECONDS = 300
"""How long the kubelet may take to restart a hung exporter: its --nvml-restart-after (60 s), then
three failed liveness probes 10 s apart, with room for a slow, shared test machine."""
SCHEDULER_RECOVERY_SECONDS = 180
"""How long the real kube-scheduler may take to place a pod after a minute without an API server:
its informers back off up to 30 s with as much jitter again (70 s in a run on this test bed)."""


@pytest.fixture(scope="module")
def outage_bed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ChartBed]:
    """The release on two nodes of a control plane of its own."""
    if os.geteuid() != 0:
        pytest.skip("real nodes need root: containerd and the kubelet mount, and manage cgroups and links")
    with LocalCluster() as cluster:
        kube = api_client(cluster.admin_kubeconfig)
        factory = NodeFactory(cluster)
        try:
            workloads = charts.workload_images(tmp_path_factory.mktemp("workload-images"))
            nodes = factory.start(2, extra_images=[*product_images().values(), *workloads])
            charts.prepare_nodes(cluster, kube, nodes)
            home = tmp_path_factory.mktemp("helm")
            # Not uninstalled: the nodes and the control plane go with the module.
            with charts.installed_release(
                cluster, kube, nodes, home, charts.chart_values(), uninstall=False
            ) as bed:
                yield bed
        finally:
            factory.stop_all()
            kube.close()  # type: ignore[no-untyped-call]


def daemon_health(address: str, path: str) -> tuple[int, str]:
    """GET the daemon's /healthz or /readyz on its node, straight from the host: (status, body)."""
    try:
        with urllib.request.urlopen(f"http://{address}:{DAEMON_HEALTH_PORT}{path}", timeout=5) as answer:
            return int(answer.status), answer.read().decode()
    except urllib.error.HTTPError as error:
        return error.code, error.read().decode()


def ready(address: str) -> bool:
    return daemon_health(address, "/readyz")[0] == 200


def daemon_containers(bed: ChartBed) -> dict[tuple[str, str], tuple[str, int]]:
    """Each container of each node pod (the plugin's and the exporter's): (pod, container) ->
    (container ID, restart count)."""
    return {
        (pod["metadata"]["name"], c["name"]): (c["containerID"], c["restartCount"])
        for component in ("kubeletplugin", "exporter")
        for pod in bed.pods(component)
        for c in pod["status"]["containerStatuses"]
    }


def plugin_containers(
    containers: dict[tuple[str, str], tuple[str, int]],
) -> dict[tuple[str, str], tuple[str, int]]:
    """Of :func:`daemon_containers`, those of the plugin's pods (the exporter's container is named
    ``exporter``)."""
    return {key: value for key, value in containers.items() if key[1] != "exporter"}


def says_api_unreachable(address: str) -> bool:
    status, reasons = daemon_health(address, "/readyz")
    return status == 503 and "the watch of" in reasons


def running_share(bed: ChartBed, namespace: str, name: str) -> tuple[RealNode, str]:
    """Create the HAMi pod ``name`` and wait until it runs with its share: its node and container ID."""
    core = client.CoreV1Api(bed.kube)
    core.create_namespaced_pod(namespace, hami_pod(name))
    check = partial(running_with_its_share, bed.kube, namespace, name)
    wait_for_pod(core, namespace, name, check, ROLLOUT_TIMEOUT, "running with its share")
    pod = core.read_namespaced_pod(name, namespace)
    assert pod.spec is not None and pod.status is not None and pod.status.container_statuses
    [node] = [n for n in bed.nodes if n.name == pod.spec.node_name]
    return node, str(pod.status.container_statuses[0].container_id)


def assert_share_kept(bed: ChartBed, namespace: str, name: str, container: str) -> None:
    """The pod ``name`` still runs in ``container`` (never restarted) and its memory limit holds:
    an allocation up to it succeeds, one byte over is refused."""
    pod = client.CoreV1Api(bed.kube).read_namespaced_pod(name, namespace)
    assert pod.status is not None and pod.status.container_statuses
    assert pod.status.container_statuses[0].container_id == container, "the GPU container was restarted"
    script = enforcement_script(HAMI_SHARE.memory)
    seen = sections(bed.kubectl("exec", "-n", namespace, name, "--", "sh", "-c", script))
    assert int(seen["info"]["total"]) == HAMI_SHARE.memory, json.dumps(seen)
    assert seen["over"]["rc"] == "2", json.dumps(seen)


def test_a_minute_without_the_api_server_costs_running_shares_nothing_and_new_pods_run_after(
    outage_bed: ChartBed,
) -> None:
    bed = outage_bed
    wait_rolled_out(bed)
    core = client.CoreV1Api(bed.kube)
    with made_namespace(bed.kube) as namespace:
        node, container = running_share(bed, namespace, "running")
        poll_until(partial(in_metrics, node.address, "running"), 60, "the share's series on its node")
        daemons = daemon_containers(bed)
        assert len(daemons) == 2 * len(bed.nodes), daemons

        bed.cluster.stop_api_server()
        began = time.monotonic()
        try:
            for each in bed.nodes:
                poll_until(
                    partial(says_api_unreachable, each.address),
                    OUTAGE_SECONDS,
                    f"the daemon on {each.name} saying it cannot reach the API server",
                )
            while time.monotonic() - began < OUTAGE_SECONDS:
                for each in bed.nodes:
                    assert daemon_health(each.address, "/healthz")[0] == 200, "alive without the API"
                    assert says_api_unreachable(each.address), daemon_health(each.address, "/readyz")
                assert in_metrics(node.address, "running"), "the exporter serves the share's series"
                time.sleep(5)
        finally:
            bed.cluster.resume_api_server()

        for each in bed.nodes:
            poll_until(partial(ready, each.address), 120, f"the daemon on {each.name} ready again")
        assert daemon_containers(bed) == daemons, "a daemon's container was restarted"
        assert_share_kept(bed, namespace, "running", container)

        core.create_namespaced_pod(namespace, hami_pod("after"))
        check = partial(running_with_its_share, bed.kube, namespace, "after")
        wait_for_pod(
            core,
            namespace,
            "after",
            check,
            SCHEDULER_RECOVERY_SECONDS + ROLLOUT_TIMEOUT,
            "a pod created after the outage running with its share",
        )


def tainted_unmonitored(kube: client.ApiClient, node: str) -> list[bool]:
    """For each device of ``node``'s ResourceSlices, whether it carries the unmonitored taint."""
    slices = raw_json(
        client.ResourceV1Api(kube).list_resource_slice(
            field_selector=f"spec.nodeName={node}", _preload_content=False
        )
    )["items"]
    return [
        any(t["key"] == UNMONITORED_TAINT for t in device.get("taints") or [])
        for item in slices
        for device in item["spec"]["devices"]
    ]


def test_nvml_hanging_on_one_gpu_taints_its_node_unmonitored_and_costs_running_shares_nothing(
    outage_bed: ChartBed,
) -> None:
    bed = outage_bed
    wait_rolled_out(bed)
    core = client.CoreV1Api(bed.kube)
    with made_namespace(bed.kube) as namespace:
        node, container = running_share(bed, namespace, "steady")
        [other] = [n for n in bed.nodes if n is not node]
        daemons = daemon_containers(bed)

        charts.simulated_gpus(node, {0: GpuFaults(nvml_hang=True)})
        try:
            poll_until(
                lambda: all(tainted_unmonitored(bed.kube, node.name)),
                120,
                f"every GPU of {node.name} tainted {UNMONITORED_TAINT}",
            )
            assert not any(tainted_unmonitored(bed.kube, other.name)), "only the hung node's GPUs"
            status, reasons = daemon_health(node.address, "/readyz")
            assert status == 503 and "NVML did not answer" in reasons, reasons
            assert daemon_health(node.address, "/healthz")[0] == 200, "alive while NVML hangs"

            core.create_namespaced_pod(namespace, hami_pod("meanwhile"))
            check = partial(running_with_its_share, bed.kube, namespace, "meanwhile")
            wait_for_pod(
                core, namespace, "meanwhile", check, ROLLOUT_TIMEOUT, "a pod placed meanwhile running"
            )
            meanwhile = core.read_namespaced_pod("meanwhile", namespace)
            assert meanwhile.spec is not None and meanwhile.spec.node_name == other.name, (
                "not on tainted GPUs"
            )
        finally:
            charts.simulated_gpus(node)

        poll_until(
            lambda: not any(tainted_unmonitored(bed.kube, node.name)), 120, "the unmonitored taints removed"
        )
        poll_until(partial(ready, node.address), 120, f"the daemon on {node.name} ready again")
        # The exporter may restart here, by design: a hang past --nvml-restart-after fails its
        # liveness (the next test). The plugin, which tainted the GPUs, must not.
        assert plugin_containers(daemon_containers(bed)) == plugin_containers(daemons), (
            "a plugin container was restarted"
        )
        assert_share_kept(bed, namespace, "steady", container)


def gpu_series(address: str, family: str) -> set[str]:
    """The device_index of every GPU with a ``family`` sample in one scrape of the node's exporter."""
    return {
        sample.labels["device_index"]
        for parsed in text_string_to_metric_families(scrape(address))
        for sample in parsed.samples
        if sample.name == family
    }


def hung_gpus(address: str) -> float:
    """tessera_exporter_nvml_hung_gpus in one scrape of the node's exporter."""
    [value] = [
        sample.value
        for parsed in text_string_to_metric_families(scrape(address))
        for sample in parsed.samples
        if sample.name == "tessera_exporter_nvml_hung_gpus"
    ]
    return float(value)


def exporter_healthz(address: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(f"http://{address}:{EXPORTER_HEALTH_PORT}/healthz", timeout=5) as answer:
            return int(answer.status), answer.read().decode()
    except urllib.error.HTTPError as error:
        return error.code, error.read().decode()
    except OSError as error:  # restarting: nothing listens for a moment
        return 0, str(error)


def test_nvml_hanging_on_one_gpu_costs_the_exporter_its_series_and_the_kubelet_restarts_it(
    outage_bed: ChartBed,
) -> None:
    bed = outage_bed
    wait_rolled_out(bed)
    node = bed.nodes[0]
    [pod] = [p["metadata"]["name"] for p in bed.pods("exporter") if p["spec"]["nodeName"] == node.name]
    before = daemon_containers(bed)
    used = "tessera_gpu_memory_used_bytes"
    assert gpu_series(node.address, used) == {"0", "1"}

    charts.simulated_gpus(node, {0: GpuFaults(nvml_hang=True)})
    try:
        poll_until(
            lambda: gpu_series(node.address, used) == {"1"}, 120, "GPU 0's series left out, GPU 1's kept"
        )
        assert hung_gpus(node.address) == 1
        poll_until(lambda: exporter_healthz(node.address)[0] == 503, 180, "the exporter's liveness to fail")
        assert "an NVML call has not returned" in exporter_healthz(node.address)[1]

        def exporter_restarted() -> bool:
            now = daemon_containers(bed)
            return now[(pod, "exporter")][1] > before[(pod, "exporter")][1]

        poll_until(exporter_restarted, EXPORTER_RESTART_SECONDS, "the kubelet to restart the exporter")
        after = daemon_containers(bed)
        assert plugin_containers(after) == plugin_containers(before), "a plugin container was restarted"
        # The fresh exporter finds GPU 0 still hung: it serves GPU 1 without it, and its liveness
        # stays green (another restart would find the same), so no restart loop.
        poll_until(
            lambda: gpu_series(node.address, used) == {"1"}, 120, "the restarted exporter serving GPU 1"
        )
        assert hung_gpus(node.address) == 1
        assert exporter_healthz(node.address)[0] == 200, exporter_healthz(node.address)
    finally:
        charts.simulated_gpus(node)

    poll_until(lambda: gpu_series(node.address, used) == {"0", "1"}, 180, "both GPUs' series back")
    assert hung_gpus(node.address) == 0
    wait_rolled_out(bed)
    assert daemon_containers(bed)[(pod, "exporter")] == after[(pod, "exporter")], "restarted again"
