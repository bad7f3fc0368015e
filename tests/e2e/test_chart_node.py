"""The chart on real nodes: `helm install` of charts/tessera runs the node daemon (DaemonSet) and the
webhook (Deployment) as pods from the locally built images (testbed/product_images.py, the same
images images/Dockerfile builds) on two test-bed nodes with simulated GPUs. The examples in
examples/, applied with kubectl unchanged, run with their shares placed and their limits enforced
inside the containers; `helm test` passes; port 31995 on each node answers with the examples'
metrics; `kubectl tessera` agrees with the allocations, and a GPU pod that waits is told each of
the five reasons by `why` and by one Event of the webhook's; a webhook pod
deleted while GPU pods are created refuses none; `helm upgrade` with changed values rolls the
DaemonSet and a prepared claim survives it.

What the test bed sets through values, and why: testbed/chart_bed.py.
"""

from __future__ import annotations

import contextlib
import io
import json
import tarfile
import threading
import time
from collections.abc import Iterator
from functools import partial
from pathlib import Path
from typing import Any, cast

import pytest
import urllib3
from kubernetes import client
from selenium.webdriver.common.by import By

from simgpu.config import make_gpus
from tessera.kube import raw_json
from tessera.kubectl import usage as kubectl_usage
from tessera.kubectl.cli import main as kubectl_tessera
from tessera.names import (
    CORDONED_TAINT,
    DEVICE_TYPE_ATTRIBUTE,
    DRIVER_NAME,
    HAMI_GPU,
    HAMI_GPUMEM,
    HAMI_USE_TYPE,
    HAMI_USE_UUID,
    METRICS_PORT,
    UUID_ATTRIBUTE,
)
from tessera.quantity import MiB, quantity_to_int
from tessera.webhook import waiting_pods
from testbed import chart_bed as charts
from testbed.browser import chromium
from testbed.browser import missing as browser_missing
from testbed.chart_bed import (
    EXAMPLE_SHARES,
    EXAMPLES,
    GPU_MEMORY,
    GPUS_PER_NODE,
    ROLLOUT_TIMEOUT,
    ChartBed,
    Expected,
    enforcement_script,
    node_address,
    scrape,
    wait_rolled_out,
)
from testbed.cluster import LocalCluster
from testbed.helm import REPO
from testbed.images import TOOLS_IMAGE
from testbed.kubectl import port_forward
from testbed.node import NodeFactory
from testbed.pod_state import events, sections, wait_for_pod, wait_until_unschedulable
from testbed.pod_stream import PodStream, in_metrics
from testbed.polling import poll_until
from testbed.product_images import load_manifest, product_images, project_version
from tests.chart_helm import CHART, values_file

pytestmark = pytest.mark.e2e

WAITING_LOOK_SECONDS = 15.0
"""The webhook's --explain-waiting-period (its default): how often each replica looks at waiting pods."""
PRODUCT = make_gpus(1)[0].name
"""What the release's simulated GPUs call themselves."""
WAITING_EVENT_SECONDS = 120.0
"""How long a waiting pod's Event may take: the scheduler's first attempt, the test bed's 5 s
(explainWaitingAfterSeconds), a look, and room for a loaded machine."""


@pytest.fixture(scope="module")
def workload_images(tmp_path_factory: pytest.TempPathFactory) -> list[Path]:
    return charts.workload_images(tmp_path_factory.mktemp("workload-images"))


@pytest.fixture(scope="module")
def chart_bed(
    cluster: LocalCluster,
    kube: client.ApiClient,
    node_factory: NodeFactory,
    workload_images: list[Path],
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[ChartBed]:
    archives = product_images()
    nodes = node_factory.start(2, extra_images=[*archives.values(), *workload_images])
    charts.prepare_nodes(cluster, kube, nodes)
    home = tmp_path_factory.mktemp("helm")
    values = charts.chart_values()
    # The web view, off by default, on here: its browser test reads this release's GPUs.
    values["webview"] = {"enabled": True, "image": values["webhook"]["image"]}
    with charts.installed_release(cluster, kube, nodes, home, values) as bed:
        yield bed


def test_helm_install_runs_the_daemonset_and_the_webhook_as_pods_from_the_local_images(
    chart_bed: ChartBed,
) -> None:
    bed = chart_bed
    try:
        wait_rolled_out(bed)
    except Exception as error:
        raise AssertionError(f"{error}\nevents:\n{events(bed.kube, bed.namespace)}") from error
    daemons = bed.pods("kubeletplugin")
    assert sorted(p["spec"]["nodeName"] for p in daemons) == sorted(n.name for n in bed.nodes)
    manifest = load_manifest()
    driver_image = f"tessera.local/{manifest.images['driver'].repository}:{project_version()}"
    exporters = bed.pods("exporter")
    assert sorted(p["spec"]["nodeName"] for p in exporters) == sorted(n.name for n in bed.nodes)
    # The kubelet plugin and the exporter run apart, in pods of their own, from the driver's image;
    # only the exporter's shares the host's PIDs.
    for pod in daemons:
        assert {c["name"]: c["image"] for c in pod["spec"]["containers"]} == {"plugin": driver_image}
        assert not pod["spec"].get("hostPID")
    for pod in exporters:
        assert {c["name"]: c["image"] for c in pod["spec"]["containers"]} == {"exporter": driver_image}
        assert pod["spec"]["hostPID"] is True
    webhooks = bed.pods("webhook")
    assert len(webhooks) == 2
    assert all(
        p["spec"]["containers"][0]["image"].startswith(
            f"tessera.local/{manifest.images['webhook'].repository}:"
        )
        for p in webhooks
    )
    resource = client.ResourceV1Api(bed.kube)
    for node in bed.nodes:
        slices = raw_json(
            resource.list_resource_slice(field_selector=f"spec.nodeName={node.name}", _preload_content=False)
        )["items"]
        devices = [d for s in slices for d in s["spec"]["devices"]]
        assert len(devices) == GPUS_PER_NODE, slices


def test_helm_test_passes(chart_bed: ChartBed) -> None:
    wait_rolled_out(chart_bed)
    # Without --logs: helm looks for every test hook's logs as a pod's in the release namespace, and
    # the chart's test pods run in a namespace of their own (and are deleted when they pass).
    out = chart_bed.helm("test", chart_bed.release, "--timeout", "5m", timeout=400)
    assert "Phase:          Succeeded" in out, out
    assert "Phase:          Failed" not in out, out


def test_port_31995_on_each_node_answers_with_per_gpu_metrics(chart_bed: ChartBed) -> None:
    wait_rolled_out(chart_bed)
    for node in chart_bed.nodes:
        text = poll_until(partial(scrape, node.address), 60, f"metrics on {node.address}:{METRICS_PORT}")
        assert "tessera_" in text
        for gpu in make_gpus(GPUS_PER_NODE, node.name, memory_bytes=GPU_MEMORY):
            assert gpu.uuid in text, f"{gpu.uuid} not in the metrics of {node.name}"


def test_every_example_has_its_expected_share_here() -> None:
    """A new example needs its line in EXAMPLE_SHARES, so that it is run below."""
    assert sorted(p.name for p in EXAMPLES.glob("*.yaml")) == sorted(EXAMPLE_SHARES)


def namespace_pods(kube: client.ApiClient, namespace: str) -> list[dict[str, Any]]:
    return list(
        raw_json(client.CoreV1Api(kube).list_namespaced_pod(namespace, _preload_content=False))["items"]
    )


def pod_claim(kube: client.ApiClient, pod: dict[str, Any]) -> dict[str, Any]:
    namespace = pod["metadata"]["namespace"]
    [status] = pod["status"]["resourceClaimStatuses"]
    resource = client.ResourceV1Api(kube)
    return raw_json(
        resource.read_namespaced_resource_claim(
            status["resourceClaimName"], namespace, _preload_content=False
        )
    )


def consumed(claim: dict[str, Any]) -> tuple[str, dict[str, int]]:
    """The claim's one allocated share: (device, consumed capacity)."""
    [result] = claim["status"]["allocation"]["devices"]["results"]
    return result["device"], {k: quantity_to_int(v) for k, v in result["consumedCapacity"].items()}


def wait_pods(kube: client.ApiClient, namespace: str, expected: Expected) -> list[dict[str, Any]]:
    """The example's pods once they are all Running (or, for pods that finish, Succeeded)."""
    phase = "Running" if expected.keeps_running else "Succeeded"

    def ready() -> list[dict[str, Any]] | None:
        pods = namespace_pods(kube, namespace)
        failed = [p["metadata"]["name"] for p in pods if p["status"].get("phase") == "Failed"]
        if failed:
            raise AssertionError(f"{failed} failed:\n{events(kube, namespace)}")
        done = [p for p in pods if p["status"].get("phase") == phase]
        return done if len(done) == expected.pods == len(pods) else None

    try:
        return poll_until(ready, ROLLOUT_TIMEOUT, f"{expected.pods} pods {phase} in {namespace}")
    except TimeoutError as error:
        raise AssertionError(f"{error}\nevents:\n{events(kube, namespace)}") from error


@pytest.mark.parametrize("example", sorted(EXAMPLE_SHARES), ids=lambda name: name.removesuffix(".yaml"))
def test_each_example_applied_unchanged_runs_with_its_share_placed_and_enforced(
    chart_bed: ChartBed, namespace: str, example: str
) -> None:
    """kubectl apply of the file as it is; every pod's claim is allocated the example's share on a
    GPU of the node the pod runs on; inside each container the limits file names that share and a
    CUDA program sees exactly its memory and cannot allocate past it; the node's port 31995 shows
    each container with its limit."""
    bed, expected = chart_bed, EXAMPLE_SHARES[example]
    wait_rolled_out(bed)
    bed.kubectl("apply", "-n", namespace, "-f", str(EXAMPLES / example))
    pods = wait_pods(bed.kube, namespace, expected)
    core = client.CoreV1Api(bed.kube)
    for pod in pods:
        name, node = pod["metadata"]["name"], pod["spec"]["nodeName"]
        assert node in {n.name for n in bed.nodes}
        if expected.keeps_running:  # a finished pod's claim is deleted with it
            claim = pod_claim(bed.kube, pod)
            _, capacity = consumed(claim)
            assert capacity == {"memory": expected.memory, "cores": expected.cores}, claim
            [term] = claim["status"]["allocation"]["nodeSelector"]["nodeSelectorTerms"]
            assert term["matchFields"] == [{"key": "metadata.name", "operator": "In", "values": [node]}], (
                claim
            )
        node_gpus = {gpu.uuid for gpu in make_gpus(GPUS_PER_NODE, node, memory_bytes=GPU_MEMORY)}
        for container in pod["spec"]["containers"]:
            log = str(core.read_namespaced_pod_log(name, namespace, container=container["name"]))
            # The limits file the container printed: one line, "<uuid> memory=<bytes> cores=<n>
            # priority=1" (low, HAMi's default), for a GPU of the pod's own node.
            share = [f"memory={expected.memory}", f"cores={expected.cores}", "priority=1"]
            [limit] = [line.split() for line in log.splitlines() if line.split()[1:] == share]
            assert limit[0] in node_gpus, log
            if not expected.keeps_running:
                continue
            seen = sections(
                bed.kubectl(
                    "exec",
                    "-n",
                    namespace,
                    name,
                    "-c",
                    container["name"],
                    "--",
                    "sh",
                    "-c",
                    enforcement_script(expected.memory),
                )
            )
            assert int(seen["info"]["total"]) == expected.memory, seen
            assert seen["over"]["rc"] == "2", seen
            assert seen["fits"]["rc"] == "0", seen
        if expected.keeps_running:
            metrics = scrape(node_address(bed, node))
            series = [
                line
                for line in metrics.splitlines()
                if line.startswith("tessera_container_gpu_memory_limit_bytes{")
                and f'namespace="{namespace}"' in line
                and f'pod="{name}"' in line
            ]
            assert len(series) == len(pod["spec"]["containers"]), metrics
            assert all(float(line.rsplit(" ", 1)[1]) == expected.memory for line in series), series


def test_kubectl_tessera_agrees_with_the_allocation_and_the_exporter(
    chart_bed: ChartBed, cluster: LocalCluster, namespace: str
) -> None:
    """A HAMi pod holding 1000 MiB of its 2000 MiB share: `kubectl tessera pods` names the GPU, node
    and limits the scheduler allocated, and the memory in use the node's exporter reports (read, as
    the plugin reads it, through the API server's pod proxy); `gpus` shows the same share on that
    GPU, with what is allocated of it, and the same figure."""
    bed = chart_bed
    wait_rolled_out(bed)
    held = 1000 * MiB
    pod = {
        "metadata": {"name": "holds"},
        "spec": {
            "restartPolicy": "Never",
            "terminationGracePeriodSeconds": 0,
            "containers": [
                {
                    "name": "gpu",
                    "image": sorted(charts.example_images())[0],
                    "imagePullPolicy": "IfNotPresent",
                    "command": ["/bin/sh", "-c", f"sleep 3600 | shim_probe alloc mem {held} hold"],
                    "resources": {"limits": {HAMI_GPU: "1", HAMI_GPUMEM: "2000"}},
                }
            ],
        },
    }
    core = client.CoreV1Api(bed.kube)
    core.create_namespaced_pod(namespace, client.V1Pod.model_validate(pod))

    def running() -> dict[str, Any] | None:
        found = raw_json(core.read_namespaced_pod("holds", namespace, _preload_content=False))
        return found if found["status"].get("phase") == "Running" else None

    placed = poll_until(running, 120, "the pod running")
    claim = pod_claim(bed.kube, placed)
    device, capacity = consumed(claim)
    node = placed["spec"]["nodeName"]

    def exporter_figure() -> float | None:
        for line in scrape(node_address(bed, node)).splitlines():
            if (
                line.startswith("tessera_container_gpu_memory_used_bytes{")
                and 'pod="holds"' in line
                and f'namespace="{namespace}"' in line
            ):
                return float(line.rsplit(" ", 1)[1]) or None
        return None

    exported = poll_until(exporter_figure, 60, "the exporter's figure for the pod")
    assert exported == held

    reached = kubectl_usage.scrape(bed.kube)
    assert (reached.reached, reached.exporters) == (len(bed.nodes), len(bed.nodes)), (
        "exporters read through the proxy"
    )

    plugin = partial(kubectl_tessera_json, cluster)

    [share] = plugin("pods", "-n", namespace)["shares"]
    assert (share["pod"], share["claim"], share["node"], share["device"]) == (
        "holds",
        claim["metadata"]["name"],
        node,
        device,
    ), share
    assert (share["memoryLimit"], share["memoryUsed"]) == (capacity["memory"], held), share
    [gpu] = [g for g in plugin("gpus")["gpus"] if g["node"] == node and g["device"] == device]
    assert gpu["uuid"] == share["uuid"]
    [on_gpu] = [s for s in gpu["shares"] if s["namespace"] == namespace]
    assert (on_gpu["claim"], on_gpu["memory"], on_gpu["memoryUsed"]) == (
        claim["metadata"]["name"],
        capacity["memory"],
        held,
    ), gpu
    assert gpu["memory"]["allocated"] >= capacity["memory"], gpu


def sleeping_gpu_pod(name: str, limits: dict[str, str], annotations: dict[str, str]) -> client.V1Pod:
    """A pod of the tools image that sleeps, asking for ``limits`` the HAMi way."""
    return client.V1Pod.model_validate(
        {
            "metadata": {"name": name, "annotations": annotations},
            "spec": {
                "restartPolicy": "Never",
                "terminationGracePeriodSeconds": 0,
                "containers": [
                    {
                        "name": "gpu",
                        "image": TOOLS_IMAGE,
                        "imagePullPolicy": "Never",
                        "command": ["sleep", "3600"],
                        "resources": {"limits": limits},
                    }
                ],
            },
        }
    )


def kubectl_tessera_json(cluster: LocalCluster, *argv: str) -> dict[str, Any]:
    """``kubectl tessera ARGV -o json`` as kubectl runs it, with the test bed's kubeconfig."""
    out, err = io.StringIO(), io.StringIO()
    status = kubectl_tessera([*argv, "-o", "json", "--kubeconfig", str(cluster.admin_kubeconfig)], out, err)
    assert status == 0, err.getvalue()
    data: dict[str, Any] = json.loads(out.getvalue())
    return data


def idle_bed_gpus(bed: ChartBed) -> dict[str, list[tuple[str, str]]]:
    """Node -> its GPUs (device, UUID) in device order, once no claim holds a share of any of them
    (earlier tests' namespaces are deleted without waiting, and their shares go with their pods)."""
    nodes = {node.name for node in bed.nodes}

    def idle() -> dict[str, list[tuple[str, str]]] | None:
        gpus = [
            g for g in kubectl_tessera_json(bed.cluster, "gpus", "--no-usage")["gpus"] if g["node"] in nodes
        ]
        if len(gpus) != len(nodes) * GPUS_PER_NODE or any(g["memory"]["allocated"] for g in gpus):
            return None
        by_node: dict[str, list[tuple[str, str]]] = {}
        for gpu in sorted(gpus, key=lambda g: (g["node"], g["device"])):
            by_node.setdefault(gpu["node"], []).append((gpu["device"], gpu["uuid"]))
        return by_node

    return poll_until(idle, 180, "the release's GPUs free of shares")


@contextlib.contextmanager
def device_cordoned(kube: client.ApiClient, node: str, device: str) -> Iterator[None]:
    """``device`` of ``node`` cordoned by a DeviceTaintRule, as docs/driver.md shows, for the
    block's length."""
    resource = client.ResourceV1Api(kube)
    rule = f"cordon-{node}-{device}"
    resource.create_device_taint_rule(
        client.V1DeviceTaintRule.model_validate(
            {
                "metadata": {"name": rule},
                "spec": {
                    "deviceSelector": {"driver": DRIVER_NAME, "pool": node, "device": device},
                    "taint": {"key": CORDONED_TAINT, "value": "maintenance", "effect": "NoSchedule"},
                },
            }
        )
    )
    try:
        yield
    finally:
        resource.delete_device_taint_rule(rule)


def wait_running(core: client.CoreV1Api, namespace: str, name: str) -> None:
    def running() -> bool:
        status = core.read_namespaced_pod(name, namespace).status
        return status is not None and status.phase == "Running"

    wait_for_pod(core, namespace, name, running, 120, f"{namespace}/{name} running")


def test_each_reason_a_gpu_pod_waits_is_told_by_why_and_once_by_the_webhook(
    chart_bed: ChartBed, namespace: str
) -> None:
    """The five reasons of a waiting GPU pod, at once on the release's two real nodes (two 80 GiB
    H100s each, here a0 a1 b0 b1), after three running pods hold 70 GiB of a0, b0 and b1 and a
    DeviceTaintRule cordons a1: a type no GPU has; a UUID no GPU has; 20 GiB on a0, b0 or b1 (10 GiB
    free on each); 20 GiB on any of them (only a1 has room, and it is cordoned); two GPUs among a0
    and b0 (one on each node). `kubectl tessera why` gives each pod its one sentence; the webhook's
    replicas put one Event on each pod with that sentence, and write no other while it stands
    (two more looks of each replica)."""
    bed = chart_bed
    wait_rolled_out(bed)
    (node_a, ((_, a0), (a1_device, a1))), (node_b, ((_, b0), (_, b1))) = sorted(idle_bed_gpus(bed).items())
    core = client.CoreV1Api(bed.kube)

    def share(gi: int, uuids: list[str], gpus: int = 1) -> tuple[dict[str, str], dict[str, str]]:
        return {HAMI_GPU: str(gpus), HAMI_GPUMEM: str(gi * 1024)}, {HAMI_USE_UUID: ",".join(uuids)}

    for uuid in (a0, b0, b1):
        core.create_namespaced_pod(namespace, sleeping_gpu_pod(f"holds-{uuid.lower()}", *share(70, [uuid])))
    for uuid in (a0, b0, b1):
        wait_running(core, namespace, f"holds-{uuid.lower()}")
    expected = {
        "wants-a100": "no GPU's product contains 'a100' (this cluster has: ",
        "wants-uuid": "no GPU has UUID 'GPU-nowhere' (this cluster has: ",
        "cordoned-out": f"every GPU that fits is cordoned: {a1} on {node_a} ({CORDONED_TAINT})",
        "two-gpus": "the claim asks for 2 different GPUs on one node, and no node has 2 GPUs with room: "
        f"{node_a} has 1 ({a0}), {node_b} has 1 ({b0})",
    }
    waiting = {
        "wants-a100": ({HAMI_GPU: "1", HAMI_GPUMEM: "1000"}, {HAMI_USE_TYPE: "a100"}),
        "wants-uuid": ({HAMI_GPU: "1", HAMI_GPUMEM: "1000"}, {HAMI_USE_UUID: "GPU-nowhere"}),
        "too-big": share(20, [a0, b0, b1]),
        "cordoned-out": share(20, [a0, a1, b0, b1]),
        "two-gpus": share(5, [a0, b0], gpus=2),
    }
    with device_cordoned(bed.kube, node_a, a1_device):
        for name, (limits, annotations) in waiting.items():
            core.create_namespaced_pod(namespace, sleeping_gpu_pod(name, limits, annotations))
        for name in waiting:
            wait_until_unschedulable(core, namespace, name, timeout=WAITING_EVENT_SECONDS)
        said = {name: kubectl_tessera_json(bed.cluster, "why", name, "-n", namespace) for name in waiting}
        for name in waiting:
            assert not said[name]["fits"], said[name]
            assert len(said[name]["reasons"]) == 1, said[name]
        for name, sentence in expected.items():
            [reason] = said[name]["reasons"]
            assert reason.startswith(sentence) if name.startswith("wants-") else reason == sentence, reason
        # Each GPU the claim may use, in the order the slices are listed.
        room, lines = said["too-big"]["reasons"][0].split(": ", 1)
        assert room == "no GPU the claim may use has room"
        assert sorted(lines.split("; ")) == sorted(
            f"{uuid} on {node} has 10Gi free, the claim asks 20Gi"
            for uuid, node in ((a0, node_a), (b0, node_b), (b1, node_b))
        )
        # The cluster may hold other modules' GPUs too: the first five products or UUIDs are named.
        assert PRODUCT in said["wants-a100"]["reasons"][0]
        assert a0 in said["wants-uuid"]["reasons"][0] or " more)" in said["wants-uuid"]["reasons"][0]

        def told() -> dict[str, list[dict[str, Any]]] | None:
            found: dict[str, list[dict[str, Any]]] = {name: [] for name in waiting}
            for event in raw_json(
                core.list_namespaced_event(
                    namespace, field_selector=f"reason={waiting_pods.REASON}", _preload_content=False
                )
            )["items"]:
                found[event["involvedObject"]["name"]].append(event)
            return found if all(found.values()) else None

        first = poll_until(told, WAITING_EVENT_SECONDS, "the webhook's Event on each waiting pod")
        for name, [event] in first.items():
            assert event["type"] == "Warning" and event["source"]["component"] == "tessera-webhook", event
            assert event["message"] == "waits for a GPU share: " + said[name]["reasons"][0], event
        time.sleep(2 * WAITING_LOOK_SECONDS)
        again = told()
        assert again is not None
        assert {
            name: [(e["metadata"]["name"], e.get("count")) for e in events] for name, events in again.items()
        } == {name: [(event["metadata"]["name"], 1)] for name, [event] in first.items()}
        for name in [*waiting, *(f"holds-{uuid.lower()}" for uuid in (a0, b0, b1))]:
            core.delete_namespaced_pod(name, namespace, grace_period_seconds=0)
        idle_bed_gpus(bed)  # the next test starts from free GPUs; the cordon goes after the pods


SCREENSHOT = REPO / "build" / "screenshots" / "webview.png"
"""Where the browser test leaves its screenshot of the page (docs/images/webview.png is one)."""

HOSTILE_TYPE = "<script>document.title='owned'</script><b id=owned>x</b>\u202e\x1b[2J" + "A" * 1900
"""A GPU type as a tenant could write it in its pod's annotation (the webhook bounds it at 2 048
characters): markup, a direction override, a terminal escape, and length."""


def test_the_web_view_shows_every_gpu_and_share_in_a_real_browser_and_escapes_what_tenants_wrote(
    chart_bed: ChartBed, namespace: str
) -> None:
    """Chromium, through `kubectl port-forward` to the chart's web view Service as its docs say:
    the page lists every GPU the driver publishes (by UUID) and, on each, exactly the shares the
    scheduler allocated there (by pod); a pod waiting for a type no GPU has is listed with the
    plugin's reason; the tenant's markup in that type is shown as text, runs nothing and makes no
    element. The view reads everything under its own read-only account: had it met a 403 the
    page would say what it could not read, and it says nothing of the kind."""
    if why_not := browser_missing():
        pytest.skip(why_not)
    bed = chart_bed
    wait_rolled_out(bed)
    core = client.CoreV1Api(bed.kube)
    for name, wanted in (("runs", {}), ("wants-odd-type", {HAMI_USE_TYPE: HOSTILE_TYPE})):
        core.create_namespaced_pod(
            namespace, sleeping_gpu_pod(name, {HAMI_GPU: "1", HAMI_GPUMEM: "1500"}, wanted)
        )
    poll_until(
        lambda: raw_json(core.read_namespaced_pod("runs", namespace, _preload_content=False))["spec"].get(
            "nodeName"
        ),
        120,
        "the running pod placed",
    )
    expected = published_and_allocated(bed.kube)
    assert any("runs" in pods for pods in expected.values()), expected
    with (
        port_forward(
            bed.cluster.admin_kubeconfig, bed.namespace, f"service/{bed.release}-webview", 8080
        ) as port,
        chromium() as browser,
    ):

        def page_with_the_waiting_pod() -> str | None:
            browser.get(f"http://127.0.0.1:{port}/")
            text = browser.find_element(By.ID, "waiting").text
            return text if f"{namespace}/wants-odd-type" in text else None

        waiting = poll_until(page_with_the_waiting_pod, 120, "the waiting pod on the page", interval=3.0)
        shown: dict[str, set[str]] = {}
        for gpu in browser.find_elements(By.CSS_SELECTOR, "article.gpu"):
            uuid = str(gpu.get_attribute("data-uuid"))
            shown[uuid] = {
                row.find_element(By.CSS_SELECTOR, "td.pod").text
                for row in gpu.find_elements(By.CSS_SELECTOR, "tr.share-row")
            }
        expected = published_and_allocated(bed.kube)  # the same moment as the page, give or take
        assert shown == {uuid: set(pods) for uuid, pods in expected.items()}
        assert (
            "no GPU's product contains '<script>document.title='owned'</script><b id=owned>x</b>" in waiting
        )
        assert browser.title == "Tessera GPUs", "no script ran"
        assert browser.find_elements(By.ID, "owned") == [], "no element made from the tenant's text"
        assert browser.find_elements(By.TAG_NAME, "script") == []
        assert "A" * 200 not in waiting, "a long value is cut"
        assert "Could not read" not in browser.find_element(By.TAG_NAME, "header").text
        SCREENSHOT.parent.mkdir(parents=True, exist_ok=True)
        browser.save_screenshot(str(SCREENSHOT))


def published_and_allocated(kube: client.ApiClient) -> dict[str, list[str]]:
    """Each GPU the driver publishes (UUID) -> the pods holding a share of it, from the API itself."""
    resource = client.ResourceV1Api(kube)
    slices = raw_json(
        resource.list_resource_slice(field_selector=f"spec.driver={DRIVER_NAME}", _preload_content=False)
    )
    by_device: dict[tuple[str, str], str] = {}
    for item in slices["items"]:
        for device in item["spec"].get("devices") or []:
            uuid = (device.get("attributes") or {}).get(UUID_ATTRIBUTE, {}).get("string")
            if (
                uuid
                and (device.get("attributes") or {}).get(DEVICE_TYPE_ATTRIBUTE, {}).get("string") != "mig"
            ):
                by_device[(item["spec"]["pool"]["name"], device["name"])] = uuid
    held: dict[str, list[str]] = {uuid: [] for uuid in by_device.values()}
    claims = raw_json(resource.list_resource_claim_for_all_namespaces(_preload_content=False))
    for claim in claims["items"]:
        owner = [o["name"] for o in claim["metadata"].get("ownerReferences") or [] if o["kind"] == "Pod"]
        for result in ((claim.get("status") or {}).get("allocation") or {}).get("devices", {}).get(
            "results"
        ) or []:
            uuid = by_device.get((result["pool"], result["device"]))
            if uuid is not None and result["driver"] == DRIVER_NAME:
                held[uuid] += owner
    return held


def test_a_webhook_pod_deleted_while_gpu_pods_are_created_refuses_none_of_them(
    chart_bed: ChartBed, namespace: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """The webhook runs two replicas (failurePolicy Fail: with none, no GPU pod is admitted). One pod
    is deleted, as a drain or an operator deletes it, while a GPU pod is created (dry run) five
    times a second: the API server calls the other replica meanwhile, the Deployment replaces the
    deleted one, and no pod is refused or left unconverted. The deleted replica's drain line (how
    long after its deletion the API server still called it: the endpoint propagation the drain
    must outlast, docs/webhook.md) is read from its log as it stops, and printed."""
    bed = chart_bed
    wait_rolled_out(bed)
    core = client.CoreV1Api(bed.kube)
    victim = bed.pods("webhook")[0]["metadata"]["name"]
    log_lines: list[str] = []
    follower = threading.Thread(
        target=partial(_follow_log, core, bed.namespace, victim, log_lines), name="victim-log", daemon=True
    )
    follower.start()
    with PodStream(bed.kube, namespace, every=0.2, dry_run=True) as stream:
        poll_until(lambda: stream.calls >= 10, 60, "GPU pods created before the deletion")
        core.delete_namespaced_pod(victim, bed.namespace)
        poll_until(
            lambda: victim not in {p["metadata"]["name"] for p in bed.pods("webhook")},
            ROLLOUT_TIMEOUT,
            f"{victim} gone",
        )
        wait_rolled_out(bed)
        after = stream.calls
        poll_until(lambda: stream.calls >= after + 10, 60, "GPU pods created after the replacement")
    assert stream.refused == [], "no GPU pod refused while a webhook pod was deleted"
    assert stream.unconverted == []
    follower.join(30)
    drained = [line for line in log_lines if "drained after" in line]
    assert drained, "the deleted replica logged no drain:\n" + "\n".join(log_lines[-20:])
    with capsys.disabled():
        print(f"\nwebhook replica deleted while 5 GPU pods a second were created: {drained[-1]}")


def _follow_log(core: client.CoreV1Api, namespace: str, pod: str, into: list[str]) -> None:
    """Append ``pod``'s log lines to ``into`` as they come, until its container stops."""
    response = cast(
        urllib3.HTTPResponse,
        core.read_namespaced_pod_log(pod, namespace, follow=True, _preload_content=False),
    )
    pending = b""
    for chunk in response.stream(4096):
        pending += chunk
        *lines, pending = pending.split(b"\n")
        into.extend(line.decode(errors="replace") for line in lines)
    into.append(pending.decode(errors="replace"))


def test_helm_upgrade_rolls_the_daemonset_and_a_prepared_claim_survives(
    chart_bed: ChartBed, namespace: str
) -> None:
    """A running pod's claim, prepared by the old daemon pods, stays enforced while the DaemonSet
    rolls to the upgraded values; the new daemon pods unprepare it when the pod goes and prepare
    new claims."""
    bed = chart_bed
    wait_rolled_out(bed)
    old = {p["metadata"]["uid"] for p in bed.pods("kubeletplugin")}
    bed.kubectl("apply", "-n", namespace, "-f", str(EXAMPLES / "claim-template-pod.yaml"))
    expected = EXAMPLE_SHARES["claim-template-pod.yaml"]
    [pod] = wait_pods(bed.kube, namespace, expected)
    name = pod["metadata"]["name"]
    claim = pod_claim(bed.kube, pod)

    values = {**bed.values, "kubeletPlugin": {**bed.values["kubeletPlugin"], "logLevel": "info"}}
    bed.helm(
        "upgrade", bed.release, str(CHART), "-f", str(values_file(bed.helm_home, values, "upgrade.yaml"))
    )
    try:
        wait_rolled_out(bed)
    except Exception as error:
        raise AssertionError(f"{error}\nevents:\n{events(bed.kube, bed.namespace)}") from error
    new = {p["metadata"]["uid"] for p in bed.pods("kubeletplugin")}
    assert len(new) == len(bed.nodes) and not new & old, "every daemon pod replaced"

    # The new daemon pod took the claim over from the checkpoint: its exporter shows the container.
    address = node_address(bed, pod["spec"]["nodeName"])
    poll_until(partial(in_metrics, address, name), 60, f"{name} in the new daemon's metrics")
    seen = sections(
        bed.kubectl("exec", "-n", namespace, name, "--", "sh", "-c", enforcement_script(expected.memory))
    )
    assert int(seen["info"]["total"]) == expected.memory, seen
    assert seen["over"]["rc"] == "2", seen
    assert pod_claim(bed.kube, pod)["metadata"]["uid"] == claim["metadata"]["uid"]

    bed.kubectl(
        "delete", "-n", namespace, "-f", str(EXAMPLES / "claim-template-pod.yaml"), "--wait", timeout=120
    )
    claims = client.ResourceV1Api(bed.kube)
    poll_until(
        lambda: (
            not raw_json(claims.list_namespaced_resource_claim(namespace, _preload_content=False))["items"]
        ),
        120,
        "the claim unprepared and deleted with its pod",
    )
    bed.kubectl("apply", "-n", namespace, "-f", str(EXAMPLES / "hami-pod.yaml"))
    wait_pods(bed.kube, namespace, EXAMPLE_SHARES["hami-pod.yaml"])


def read_archive(archive: Path) -> tuple[dict[str, Any], dict[str, bytes]]:
    """An image archive's configuration and its (one) layer's files: path -> contents, for files
    up to 64 KiB (larger ones map to b"")."""
    with tarfile.open(archive) as outer:
        blobs = {m.name: m for m in outer.getmembers() if m.isfile()}

        def blob(name: str) -> bytes:
            extracted = outer.extractfile(blobs[name])
            assert extracted is not None
            return extracted.read()

        def by_digest(digest: str) -> bytes:
            return blob(f"blobs/sha256/{digest.removeprefix('sha256:')}")

        [descriptor] = json.loads(blob("index.json"))["manifests"]
        manifest = json.loads(by_digest(descriptor["digest"]))
        [layer] = manifest["layers"]
        config = json.loads(by_digest(manifest["config"]["digest"]))
        files: dict[str, bytes] = {}
        with tarfile.open(fileobj=io.BytesIO(by_digest(layer["digest"]))) as tar:
            for member in tar.getmembers():
                small = member.isfile() and member.size <= 65536
                extracted = tar.extractfile(member) if small else None
                files[member.name] = extracted.read() if extracted is not None else b""
    return config, files


def test_the_local_images_hold_the_manifests_runtime_at_the_images_paths() -> None:
    """What the nodes run: Debian's interpreter, the venv with its commands pointing at the venv's
    interpreter, Tessera with its preload shim, the configuration of images.toml; nothing names the
    folder the build ran in, and pip is gone."""
    manifest = load_manifest()
    venv = manifest.venv.lstrip("/")
    site = f"{venv}/lib/python3.11/site-packages"
    for name, archive in product_images().items():
        config, files = read_archive(archive)
        image = manifest.images[name]
        assert config["config"]["Entrypoint"] == list(image.entrypoint)
        assert config["config"]["User"] == image.user
        for path in (
            manifest.python.lstrip("/"),
            "usr/lib/python3.11/os.py",
            f"{venv}/bin/python3.11",
            f"{venv}/pyvenv.cfg",
            f"{site}/tessera/shim/lib/libtessera-cuda.so",
            f"{site}/tessera/shim/lib/libtessera-nvml.so",
            *(e.lstrip("/") for e in image.entrypoint),
        ):
            assert path in files, f"{path} not in {name}"
        assert files[image.entrypoint[0].lstrip("/")].startswith(f"#!{manifest.venv}/bin/python".encode())
        assert f"home = {Path(manifest.python).parent}\n".encode() in files[f"{venv}/pyvenv.cfg"]
        assert not [p for p in files if p.startswith((f"{site}/pip/", f"{site}/setuptools/"))]
        assert not [
            p for p, data in files.items() if p.startswith(f"{venv}/bin/") and b"product-images" in data
        ]
