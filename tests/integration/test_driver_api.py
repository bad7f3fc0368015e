"""The node daemon against the real control plane: what it publishes, how the scheduler uses it, and
how prepare behaves through the kubelet's socket protocol, across crashes, damage and reboots.

The nodes here are kubelet-less Node objects: the real scheduler allocates claims for pods bound to
them, and the test makes the kubelet's calls itself (``KubeletClient``), so every step of prepare can
be interrupted and checked. tests/e2e/test_driver_node.py runs the same daemon under a real kubelet.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import replace
from typing import Any

import grpc
import pytest
from kubernetes import client

from simgpu.config import GpuFaults, process_env
from tessera.driver.health import dra_socket_answers
from tessera.driver.state import PREPARE_STEPS
from tessera.kube import raw_json
from tessera.names import DRIVER_NAME, UNHEALTHY_TAINT, UNMONITORED_TAINT
from tessera.proto.health.v1 import api_pb2 as health
from tessera.proto.health.v1 import api_pb2_grpc as health_grpc
from tessera.quantity import GiB, quantity_to_int
from tessera.shim import format as shim_format
from testbed.cluster import LocalCluster
from testbed.dra_objects import allocated_claim
from testbed.driver_node import DriverNode, ensure_device_class, published_driver_node
from testbed.kubelet_client import ClaimRef, KubeletClient, plugin_info
from testbed.polling import poll_until
from testbed.process import ManagedProcess, free_port
from testbed.share_pods import share_pod

pytestmark = pytest.mark.integration


@pytest.fixture
def driver_node(
    cluster: LocalCluster, kube: client.ApiClient, fake_node: Callable[..., str]
) -> Iterator[DriverNode]:
    """The daemon on a fresh kubelet-less node with 4 simulated 80 GiB GPUs, published."""
    with published_driver_node(cluster, kube, fake_node(), gpus=4) as node:
        yield node


def slice_of(kube: client.ApiClient, node: str) -> dict[str, Any] | None:
    items = raw_json(
        client.ResourceV1Api(kube).list_resource_slice(
            field_selector=f"spec.nodeName={node}", _preload_content=False
        )
    )["items"]
    return items[0] if items else None


def test_every_gpu_is_published_as_shareable_capacity_under_the_charts_rbac(
    driver_node: DriverNode, kube: client.ApiClient
) -> None:
    published = slice_of(kube, driver_node.node_name)
    assert published is not None
    spec = published["spec"]
    assert spec["driver"] == DRIVER_NAME
    assert spec["pool"]["name"] == driver_node.node_name
    assert spec["pool"]["resourceSliceCount"] == 1
    assert published["metadata"]["ownerReferences"][0]["kind"] == "Node"
    uuids = {d["attributes"]["uuid"]["string"] for d in spec["devices"]}
    assert uuids == {g.uuid for g in driver_node.simgpu.spec.gpus}
    for device in spec["devices"]:
        assert device["allowMultipleAllocations"] is True
        assert quantity_to_int(device["capacity"]["memory"]["value"]) == 80 * GiB
        assert quantity_to_int(device["capacity"]["cores"]["value"]) == 100


def test_a_deleted_slice_comes_back(driver_node: DriverNode, kube: client.ApiClient) -> None:
    """The kubelet deletes its node's slices when it starts; anyone may. The daemon notices the
    deletion through its watch and publishes again with a newer pool generation."""
    resource = client.ResourceV1Api(kube)
    before = slice_of(kube, driver_node.node_name)
    assert before is not None
    resource.delete_resource_slice(before["metadata"]["name"])
    again = poll_until(
        lambda: (
            (s := slice_of(kube, driver_node.node_name))
            and s["metadata"]["uid"] != before["metadata"]["uid"]
            and s
        ),
        30,
        "the slice to be published again",
    )
    assert again["spec"]["pool"]["generation"] > before["spec"]["pool"]["generation"]
    assert again["spec"]["devices"] == before["spec"]["devices"]


def test_shares_are_allocated_from_the_published_capacity_and_prepared_through_the_socket(
    driver_node: DriverNode, kube: client.ApiClient, namespace: str
) -> None:
    claims = [
        share_pod(kube, namespace, driver_node.node_name, "a", memory="20Gi", cores="30"),
        share_pod(kube, namespace, driver_node.node_name, "b", memory="20Gi", cores="30"),
        share_pod(kube, namespace, driver_node.node_name, "c", memory="40Gi", cores="40"),
    ]
    kubelet = KubeletClient(driver_node.dra_socket)
    try:
        response = kubelet.prepare(claims)
    finally:
        kubelet.close()
    assert sorted(response.claims) == sorted(uid for _, _, uid in claims)
    for (_, _, uid), (memory, cores) in zip(claims, [(20, 30), (20, 30), (40, 40)], strict=True):
        result = response.claims[uid]
        assert result.error == ""
        (device,) = result.devices
        assert device.HasField("share_id") and device.share_id
        assert device.pool_name == driver_node.node_name
        assert list(device.request_names) == ["gpu"]
        assert list(device.cdi_device_ids) == [
            f"k8s.gpu.tessera.dev/claim={uid}-{device.device_name}-{device.share_id}"
        ]
        limits = shim_format.read_limits(driver_node.state_dir / "claims" / uid / "limits")
        assert limits is not None
        ((gpu_limit),) = limits
        assert (gpu_limit.memory_bytes, gpu_limit.cores) == (memory * GiB, cores)


def test_one_bad_claim_fails_alone_with_a_sentence_and_good_ones_are_prepared(
    driver_node: DriverNode, kube: client.ApiClient, namespace: str
) -> None:
    good = share_pod(kube, namespace, driver_node.node_name, "good", memory="1Gi", cores="5")
    replaced = (good[0], good[1], "00000000-0000-0000-0000-000000000000")
    missing = (namespace, "no-such-claim", "11111111-1111-1111-1111-111111111111")
    kubelet = KubeletClient(driver_node.dra_socket)
    try:
        response = kubelet.prepare([good, replaced, missing])
        assert response.claims[good[2]].error == ""
        assert response.claims[good[2]].devices
        assert "was replaced" in response.claims[replaced[2]].error
        assert f"ResourceClaim {namespace}/no-such-claim does not exist" == response.claims[missing[2]].error
        unknown = kubelet.unprepare([missing])
        assert unknown.claims[missing[2]].error == ""
    finally:
        kubelet.close()


@pytest.mark.parametrize("crash_point", PREPARE_STEPS)
def test_a_daemon_killed_at_any_step_of_prepare_converges_on_the_kubelets_retry(
    driver_node: DriverNode, kube: client.ApiClient, namespace: str, crash_point: str
) -> None:
    claim = share_pod(kube, namespace, driver_node.node_name, "crash", memory="10Gi", cores="10")
    driver_node.stop()
    driver_node.start(crash_point=crash_point)
    driver_node.wait_serving()
    kubelet = KubeletClient(driver_node.dra_socket)
    try:
        with pytest.raises(Exception):  # noqa: B017 - the daemon dies mid-call: any gRPC error
            kubelet.prepare([claim])
    finally:
        kubelet.close()
    assert driver_node.process is not None
    poll_until(lambda: not driver_node.process.running(), 10, "the daemon to die")  # type: ignore[union-attr]
    driver_node.start()
    driver_node.wait_serving()
    kubelet = KubeletClient(driver_node.dra_socket)
    try:
        first = kubelet.prepare([claim]).claims[claim[2]]
        second = kubelet.prepare([claim]).claims[claim[2]]
    finally:
        kubelet.close()
    assert first.error == "" and first == second
    claims_dir = driver_node.state_dir / "claims"
    assert [p.name for p in claims_dir.iterdir()] == [claim[2]]
    specs = [p.name for p in driver_node.cdi_dir.iterdir() if not p.name.startswith(".")]
    assert specs == [f"k8s.gpu.tessera.dev-claim_{claim[2]}.json"]
    record = json.loads((driver_node.state_dir / "checkpoint.json").read_text())["data"]["claims"][claim[2]]
    assert record["state"] == "PrepareCompleted"


def test_a_corrupt_checkpoint_is_quarantined_and_rebuilt_from_the_api_and_the_host(
    driver_node: DriverNode, kube: client.ApiClient, namespace: str
) -> None:
    kept = share_pod(kube, namespace, driver_node.node_name, "kept", memory="1Gi", cores="1")
    gone = share_pod(kube, namespace, driver_node.node_name, "gone", memory="1Gi", cores="1")
    kubelet = KubeletClient(driver_node.dra_socket)
    try:
        kubelet.prepare([kept, gone])
    finally:
        kubelet.close()
    driver_node.stop()
    client.CoreV1Api(kube).delete_namespaced_pod("gone", namespace, grace_period_seconds=0)
    poll_until(lambda: _claim_gone(kube, gone), 60, "the deleted pod's claim to go")
    (driver_node.state_dir / "checkpoint.json").write_text('{"version": 1, "checksum": "x", "da')
    driver_node.start()
    driver_node.wait_serving()
    records = poll_until(lambda: _records(driver_node), 30, "a rebuilt checkpoint")
    assert set(records) == {kept[2]}
    assert records[kept[2]]["state"] == "PrepareCompleted"
    assert not (driver_node.state_dir / "claims" / gone[2]).exists()
    assert list(driver_node.state_dir.glob("checkpoint.json.quarantined-*"))


def test_after_a_reboot_claims_still_allocated_here_are_prepared_again(
    driver_node: DriverNode, kube: client.ApiClient, namespace: str
) -> None:
    claim = share_pod(kube, namespace, driver_node.node_name, "boot", memory="2Gi", cores="3")
    kubelet = KubeletClient(driver_node.dra_socket)
    try:
        kubelet.prepare([claim])
    finally:
        kubelet.close()
    driver_node.stop()
    for spec in driver_node.cdi_dir.iterdir():  # /var/run is a tmpfs: a reboot empties it
        spec.unlink()
    driver_node.reboot()
    driver_node.start()
    driver_node.wait_serving()
    spec_file = driver_node.cdi_dir / f"k8s.gpu.tessera.dev-claim_{claim[2]}.json"
    poll_until(spec_file.exists, 30, "the claim's CDI spec written again")
    checkpoint = json.loads((driver_node.state_dir / "checkpoint.json").read_text())["data"]
    assert checkpoint["bootId"] == driver_node.boot_id_file.read_text().strip()
    assert checkpoint["claims"][claim[2]]["state"] == "PrepareCompleted"


def test_a_lost_gpu_is_tainted_no_new_share_lands_on_it_and_the_taint_goes_when_it_recovers(
    driver_node: DriverNode, kube: client.ApiClient, namespace: str
) -> None:
    lost = driver_node.simgpu.spec.gpus[0]
    gpus = list(driver_node.simgpu.spec.gpus)
    gpus[0] = replace(lost, faults=GpuFaults(lost=True))
    driver_node.simgpu.update(replace(driver_node.simgpu.spec, gpus=tuple(gpus)))

    def device(uuid: str) -> dict[str, Any]:
        published = slice_of(kube, driver_node.node_name)
        assert published is not None
        return next(d for d in published["spec"]["devices"] if d["attributes"]["uuid"]["string"] == uuid)

    poll_until(lambda: device(lost.uuid).get("taints"), 30, "the lost GPU tainted")
    (taint,) = device(lost.uuid)["taints"]
    assert (taint["key"], taint["effect"]) == (UNHEALTHY_TAINT, "NoSchedule")
    assert taint["value"] == "GPU-is-lost"
    claims = [
        share_pod(kube, namespace, driver_node.node_name, f"p{i}", memory="60Gi", cores="10")
        for i in range(3)
    ]
    allocated = {_allocated_device(kube, c) for c in claims}
    assert device(lost.uuid)["name"] not in allocated
    assert len(allocated) == 3

    gpus[0] = lost
    driver_node.simgpu.update(replace(driver_node.simgpu.spec, gpus=tuple(gpus)))
    poll_until(lambda: "taints" not in device(lost.uuid), 30, "the recovered GPU untainted")


def _allocated_device(kube: client.ApiClient, claim: ClaimRef) -> str:
    body = raw_json(
        client.ResourceV1Api(kube).read_namespaced_resource_claim(claim[1], claim[0], _preload_content=False)
    )
    (result,) = body["status"]["allocation"]["devices"]["results"]
    return str(result["device"])


def _claim_gone(kube: client.ApiClient, claim: ClaimRef) -> bool:
    items = raw_json(
        client.ResourceV1Api(kube).list_namespaced_resource_claim(claim[0], _preload_content=False)
    )["items"]
    return all(i["metadata"]["uid"] != claim[2] for i in items)


def _records(node: DriverNode) -> dict[str, Any] | None:
    try:
        claims: dict[str, Any] = json.loads((node.state_dir / "checkpoint.json").read_text())["data"][
            "claims"
        ]
    except (OSError, ValueError, KeyError):
        return None
    return claims if claims else None


def test_the_plugin_offers_dra_v1_first_then_v1beta1_and_both_health_versions(
    driver_node: DriverNode,
) -> None:
    info = plugin_info(driver_node.registration_socket)
    assert (info.type, info.name, info.endpoint) == ("DRAPlugin", DRIVER_NAME, str(driver_node.dra_socket))
    assert list(info.supported_versions) == [
        "v1.DRAPlugin",
        "v1beta1.DRAPlugin",
        "v1.DRAResourceHealth",
        "v1alpha1.DRAResourceHealth",
    ]


def test_the_health_service_lists_every_gpu_and_reports_a_lost_one_with_nvmls_reason(
    driver_node: DriverNode,
) -> None:
    channel = grpc.insecure_channel(f"unix:{driver_node.dra_socket}")
    stream = health_grpc.DRAResourceHealthStub(channel).NodeWatchResources(
        health.NodeWatchResourcesRequest(), timeout=60
    )
    try:
        first = next(stream)
        assert len(first.devices) == 4
        assert {d.health for d in first.devices} == {health.HEALTHY}
        assert {d.device.pool_name for d in first.devices} == {driver_node.node_name}
        gpus = list(driver_node.simgpu.spec.gpus)
        gpus[2] = replace(gpus[2], faults=GpuFaults(lost=True))
        driver_node.simgpu.update(replace(driver_node.simgpu.spec, gpus=tuple(gpus)))
        for update in stream:
            unhealthy = [d for d in update.devices if d.health == health.UNHEALTHY]
            if unhealthy:
                break
        assert len(update.devices) == 4, "every report is the complete list"
        (lost,) = unhealthy
        assert lost.device.device_name == "gpu-" + gpus[2].uuid.lower().removeprefix("gpu-")
        assert lost.message == "NVML: GPU is lost"
    finally:
        stream.cancel()
        channel.close()


def test_a_claim_deleted_while_prepared_is_cleaned_up_by_the_periodic_sweep(
    cluster: LocalCluster, kube: client.ApiClient, fake_node: Callable[..., str], namespace: str
) -> None:
    """The kubelet normally unprepares; a claim it never tells us about (the daemon was down, the
    pod went) is found by the sweep and its folder and CDI spec are removed."""
    ensure_device_class(kube)
    node = DriverNode(cluster, fake_node(), gpus=1, cleanup_interval=1.0)
    try:
        node.start()
        node.wait_published()
        claim = share_pod(kube, namespace, node.node_name, "swept", memory="1Gi", cores="1")
        kubelet = KubeletClient(node.dra_socket)
        try:
            assert kubelet.prepare([claim]).claims[claim[2]].error == ""
        finally:
            kubelet.close()
        folder = node.state_dir / "claims" / claim[2]
        assert folder.exists()
        client.CoreV1Api(kube).delete_namespaced_pod("swept", namespace, grace_period_seconds=0)
        poll_until(lambda: _claim_gone(kube, claim), 60, "the claim deleted with its pod")
        poll_until(lambda: not folder.exists(), 30, "the sweep to unprepare the claim")
        assert not any(node.cdi_dir.glob(f"*{claim[2]}*"))
        assert _records(node) is None
    finally:
        node.cleanup()


def test_sigterm_removes_both_sockets_and_the_probes_say_why_it_is_not_ready(driver_node: DriverNode) -> None:
    assert driver_node.get("/healthz") == (200, "ok\n")
    status, body = driver_node.get("/readyz")
    assert (status, body) == (503, "not registered with the kubelet yet\n"), "no kubelet on this node"
    assert driver_node.process is not None
    driver_node.stop()
    assert driver_node.process.returncode == 0
    assert not driver_node.dra_socket.exists()
    assert not driver_node.registration_socket.exists()


def test_the_claim_itself_says_whether_each_share_was_prepared_and_why_not(
    driver_node: DriverNode, kube: client.ApiClient, namespace: str
) -> None:
    """Ready=True on a prepared share; Ready=False with the one-sentence reason on a share that
    cannot be prepared (here an allocation naming a GPU the node does not have), written by the
    daemon under its node-bound account, next to the kubelet's pod event."""
    resource = client.ResourceV1Api(kube)
    published = slice_of(kube, driver_node.node_name)
    assert published is not None
    device = published["spec"]["devices"][0]["name"]
    good = allocated_claim(resource, namespace, driver_node.node_name, device, "good")
    bad = allocated_claim(resource, namespace, driver_node.node_name, "gpu-not-here", "bad")
    kubelet = KubeletClient(driver_node.dra_socket)
    try:
        response = kubelet.prepare([good, bad])
    finally:
        kubelet.close()
    assert "gpu-not-here, which this node does not have" in response.claims[bad[2]].error

    def ready(claim: ClaimRef) -> dict[str, Any] | None:
        body = raw_json(resource.read_namespaced_resource_claim(claim[1], claim[0], _preload_content=False))
        devices = (body.get("status") or {}).get("devices") or []
        return devices[0]["conditions"][0] if devices else None

    good_ready = poll_until(lambda: ready(good), 30, "the prepared claim's status")
    assert (good_ready["type"], good_ready["status"], good_ready["reason"]) == ("Ready", "True", "Prepared")
    bad_ready = poll_until(lambda: ready(bad), 30, "the failed claim's status")
    assert (bad_ready["status"], bad_ready["reason"]) == ("False", "PrepareFailed")
    assert bad_ready["message"] == response.claims[bad[2]].error


def second_daemon(driver_node: DriverNode, health_port: int) -> ManagedProcess:
    """Another daemon on ``driver_node``'s node and state directory, with its own health port."""
    return ManagedProcess(
        "tessera-driver-second",
        [*driver_node.argv(), f"--health-port={health_port}"],
        driver_node.work_dir,
        env=process_env(driver_node.simgpu.config),
    )


def test_a_second_daemon_on_the_same_state_waits_for_the_first_and_then_takes_over(
    driver_node: DriverNode,
) -> None:
    """Two daemons on one node (a surge rollout, a copy run by hand) would each rewrite the claims'
    checkpoint from their own memory. The second waits on the state directory's lock, says who holds
    it and serves nothing; meanwhile it answers its probes as a ready standby (a surge rollout
    removes the old pod only once the new one is ready), and it starts serving once the first has
    gone."""
    assert driver_node.process is not None
    first_pid = driver_node.process.pid
    second_health = free_port()
    second = second_daemon(driver_node, second_health)

    def probe(path: str) -> int:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{second_health}{path}", timeout=2) as answer:
                return int(answer.status)
        except urllib.error.HTTPError as error:
            return error.code

    try:
        waiting = f"another tessera-driver (pid {first_pid}) holds"
        second.wait_until(lambda: waiting in second.log_tail(), 60, "the second daemon to say it waits")
        assert driver_node.get("/healthz") == (200, "ok\n"), "the first daemon keeps serving"
        assert "registration socket" not in second.log_tail(), (
            "the second daemon serves nothing while it waits"
        )
        assert (probe("/healthz"), probe("/readyz")) == (200, 200), "a standby is alive and ready"

        driver_node.stop()
        second.wait_until(
            lambda: dra_socket_answers(driver_node.dra_socket), 60, "the second daemon to serve"
        )
        assert "took " in second.log_tail()
    finally:
        second.stop()


def test_a_standby_stopped_before_its_turn_exits_cleanly_and_the_first_daemon_serves_on(
    driver_node: DriverNode,
) -> None:
    """A surge rollout undone, or a copy run by hand and stopped: the standby ends while the first
    daemon still holds the state directory. Stopping is not failing: it exits 0 and says it stopped,
    and the first daemon serves on."""
    second = second_daemon(driver_node, free_port())
    try:
        second.wait_until(lambda: "waiting for it to exit" in second.log_tail(), 60, "the standby waiting")
    finally:
        second.stop(grace=120)  # long: only a daemon that ignores SIGTERM needs it, and it fails below
    said = second.log_tail()
    assert second.returncode == 0, said
    assert "daemon: stopped" in said and "cannot run" not in said, said
    assert driver_node.get("/healthz") == (200, "ok\n")
    assert dra_socket_answers(driver_node.dra_socket)


@pytest.mark.parametrize(
    "stopped_at",
    [
        pytest.param("serving health on", id="before-the-state-lock"),
        pytest.param("GPUs to share", id="after-gpu-discovery"),
    ],
)
def test_a_daemon_stopped_while_it_starts_exits_cleanly_without_sitting_out_the_nvml_timeout(
    cluster: LocalCluster, kube: client.ApiClient, fake_node: Callable[..., str], stopped_at: str
) -> None:
    """A rollout may replace a daemon that is still starting. Stopped once it logs ``stopped_at`` it
    exits 0 and serves nothing, rather than waiting out the NVML timeout (an hour here) for a first
    health poll the stop prevented. Stopped before it has the state lock, the stop always precedes
    that poll; stopped after GPU discovery it does in most runs (the poll starts a moment later)."""
    ensure_device_class(kube)
    node = DriverNode(cluster, fake_node(), gpus=2)
    try:
        node.start(extra_args=["--nvml-timeout=3600"])
        daemon = node.process
        assert daemon is not None
        daemon.wait_until(lambda: stopped_at in daemon.log_tail(), 60, f"the daemon logging {stopped_at!r}")
        daemon.stop(grace=120)  # long: only a daemon that ignores SIGTERM needs it, and it fails below
        said = daemon.log_tail()
        assert daemon.returncode == 0, said
        assert "daemon: stopped" in said, said
        assert not node.registration_socket.exists(), "the kubelet must not find a stopped daemon's socket"
    finally:
        node.cleanup()


def test_a_wedged_nvml_makes_every_gpu_unmonitored_and_the_daemon_not_ready_but_alive(
    driver_node: DriverNode, kube: client.ApiClient, namespace: str
) -> None:
    """NVML calls on one GPU hang (the simulated driver's nvml_hang): within the daemon's NVML timeout
    every GPU carries the unmonitored taint and the daemon says it is not ready, and why; it stays
    alive and keeps preparing claims (prepare does not wait on NVML); when NVML answers again the
    taints go."""
    allocated_before = share_pod(kube, namespace, driver_node.node_name, "before", memory="1Gi", cores="5")
    gpus = list(driver_node.simgpu.spec.gpus)
    hung = gpus[0]
    gpus[0] = replace(hung, faults=GpuFaults(nvml_hang=True))
    driver_node.simgpu.update(replace(driver_node.simgpu.spec, gpus=tuple(gpus)))

    def taint_keys() -> list[list[str]]:
        published = slice_of(kube, driver_node.node_name)
        assert published is not None
        return [[t["key"] for t in d.get("taints") or []] for d in published["spec"]["devices"]]

    poll_until(lambda: all(UNMONITORED_TAINT in keys for keys in taint_keys()), 60, "every GPU unmonitored")
    status, reasons = driver_node.get("/readyz")
    assert (status, reasons.split("; ")[0]) == (503, "NVML did not answer within 10 s")
    assert driver_node.get("/healthz") == (200, "ok\n")
    kubelet = KubeletClient(driver_node.dra_socket)
    try:
        response = kubelet.prepare([allocated_before])
    finally:
        kubelet.close()
    assert response.claims[allocated_before[2]].error == ""

    gpus[0] = hung
    driver_node.simgpu.update(replace(driver_node.simgpu.spec, gpus=tuple(gpus)))
    poll_until(lambda: taint_keys() == [[]] * len(gpus), 60, "the unmonitored taints removed")
    assert "NVML" not in driver_node.get("/readyz")[1]
