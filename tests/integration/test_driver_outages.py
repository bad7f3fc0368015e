"""The node daemon while the API server is gone: stopped, or behind a black hole that drops
everything, for longer than the daemon's bounds on an API call and on a silent watch. The daemon
stays up, says it is not ready and why, keeps preparing the claims it has read, never touches what
it prepared, and prepares new pods' claims once the server is back.

The daemon runs with shorter bounds than the product's defaults (--api-timeout 30 s,
--api-watch-idle-timeout 60 s), and the outage outlasts them as a minute outlasts the defaults: what
is checked is the same, in half the time.

These tests stop the API server, so they run on a control plane of their own, not the session's.
The node is kubelet-less: the test makes the kubelet's calls itself (KubeletClient).
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
from kubernetes import client

from tessera.kube import CONNECT_TIMEOUT, api_client
from tessera.shim import format as shim_format
from testbed.binaries import COMPONENTS
from testbed.cluster import LocalCluster
from testbed.driver_node import DriverNode, ensure_device_class
from testbed.fake_nodes import create_ready_node
from testbed.kubelet_client import ClaimRef, KubeletClient
from testbed.names import unique_name
from testbed.polling import poll_until
from testbed.share_pods import share_pod
from testbed.tcp_relay import TcpRelay
from tests.conftest import made_namespace

pytestmark = pytest.mark.integration

API_TIMEOUT = 8.0
WATCH_IDLE_TIMEOUT = 16.0
OUTAGE_SECONDS = 30
"""Longer than a call's bound (connect 5 s + API_TIMEOUT) and a silent watch's (WATCH_IDLE_TIMEOUT)."""
assert max(CONNECT_TIMEOUT + API_TIMEOUT, WATCH_IDLE_TIMEOUT) < OUTAGE_SECONDS


@pytest.fixture(scope="module")
def own_cluster() -> Iterator[LocalCluster]:
    if any(COMPONENTS[name].missing() for name in ("etcd", "kubernetes")):
        pytest.fail("test-bed binaries not built: run `make binaries`")
    with LocalCluster() as running:
        yield running


@pytest.fixture(scope="module")
def own_kube(own_cluster: LocalCluster) -> client.ApiClient:
    kube = api_client(own_cluster.admin_kubeconfig)
    ensure_device_class(kube)
    return kube


@pytest.fixture
def own_namespace(own_kube: client.ApiClient) -> Iterator[str]:
    with made_namespace(own_kube) as name:
        yield name


@pytest.fixture
def node(own_cluster: LocalCluster, own_kube: client.ApiClient) -> Iterator[DriverNode]:
    name = unique_name("node")
    create_ready_node(own_kube, name)
    driver = DriverNode(
        own_cluster,
        name,
        gpus=2,
        daemon_args=(f"--api-timeout={API_TIMEOUT}", f"--api-watch-idle-timeout={WATCH_IDLE_TIMEOUT}"),
    )
    yield driver
    driver.cleanup()
    client.CoreV1Api(own_kube).delete_node(name)


def prepare(node: DriverNode, claim: ClaimRef) -> str:
    """One NodePrepareResources call for ``claim``, as the kubelet makes it: its error, "" if none."""
    kubelet = KubeletClient(node.dra_socket)
    try:
        return str(kubelet.prepare([claim]).claims[claim[2]].error)
    finally:
        kubelet.close()


def limits_of(node: DriverNode, claim: ClaimRef) -> list[shim_format.GpuLimit] | None:
    return shim_format.read_limits(node.state_dir / "claims" / claim[2] / "limits")


def ready_reasons(node: DriverNode) -> str:
    status, body = node.get("/readyz")
    return "" if status == 200 else body


def ride_out_the_outage(node: DriverNode, prepared: ClaimRef, began: float) -> None:
    """While the API server is away: the daemon alive, not ready for that reason, the claim it had
    read still prepared on the kubelet's retry, its files untouched."""
    before = limits_of(node, prepared)
    poll_until(
        lambda: "the watch of Resource" in ready_reasons(node),
        OUTAGE_SECONDS,
        "the daemon to say the API is gone",
    )
    while time.monotonic() - began < OUTAGE_SECONDS:
        assert node.process is not None and node.process.running(), node.process and node.process.log_tail()
        assert node.get("/healthz") == (200, "ok\n")
        assert prepare(node, prepared) == "", "a claim the daemon has read is prepared without the API"
        assert limits_of(node, prepared) == before
        time.sleep(5)


PLUGIN_GRACE_SECONDS = 60.0
"""The chart's kubeletPlugin.terminationGracePeriodSeconds: after it the kubelet kills the daemon."""

SCHEDULER_RECOVERY_SECONDS = 180
"""How long the real kube-scheduler may take to place a pod after an outage of the API server:
its informers back off up to 30 s with as much jitter again, and it placed the first pod 70 s after
the server came back in a run on this test bed."""


def a_new_pod_is_prepared(node: DriverNode, kube: client.ApiClient, namespace: str, name: str) -> None:
    after = share_pod(
        kube,
        namespace,
        node.node_name,
        name,
        bind_timeout=SCHEDULER_RECOVERY_SECONDS,
        memory="1Gi",
        cores="5",
    )
    poll_until(lambda: prepare(node, after) == "", 90, "a new pod's claim prepared after the outage")
    poll_until(lambda: "the watch of" not in ready_reasons(node), 90, "the daemon to see the API again")


def serving_a_share(node: DriverNode, kube: client.ApiClient, namespace: str) -> ClaimRef:
    """Start the daemon, wait for its slice, and have it prepare one pod's claim: the share that must
    ride out the outage."""
    node.start()
    node.wait_published()
    running = share_pod(kube, namespace, node.node_name, "running", memory="2Gi", cores="10")
    assert prepare(node, running) == ""
    return running


def test_the_api_server_stopped_for_longer_than_the_daemons_bounds(
    own_cluster: LocalCluster, own_kube: client.ApiClient, own_namespace: str, node: DriverNode
) -> None:
    running = serving_a_share(node, own_kube, own_namespace)
    began = time.monotonic()
    own_cluster.stop_api_server()
    try:
        ride_out_the_outage(node, running, began)
    finally:
        own_cluster.resume_api_server()

    a_new_pod_is_prepared(node, own_kube, own_namespace, "after")
    assert node.process is not None and node.process.running()


def test_a_black_hole_to_the_api_server_for_longer_than_the_daemons_bounds(
    own_cluster: LocalCluster, own_kube: client.ApiClient, own_namespace: str, node: DriverNode
) -> None:
    """Dropped, not refused: the daemon's connections stay open and nothing comes back, which only
    its own bounds notice (API_TIMEOUT for a call, WATCH_IDLE_TIMEOUT for a silent watch). Stopped at the
    end of the outage, with its claim-status writes queued and one hanging, the daemon exits 0 by
    itself within the kubelet's grace period (the chart's 60 s), and a new start serves once the
    server is back."""
    relay = TcpRelay(own_cluster.api_port)
    try:
        through_relay(node.kubeconfig, relay.port)
        running = serving_a_share(node, own_kube, own_namespace)
        began = time.monotonic()
        relay.black_hole()
        try:
            ride_out_the_outage(node, running, began)
            assert node.process is not None
            node.process.stop(grace=PLUGIN_GRACE_SECONDS)  # SIGKILL past the grace, as the kubelet
            assert node.process.returncode == 0, node.process.log_tail()
        finally:
            relay.restore()

        node.start()
        node.wait_published()
        a_new_pod_is_prepared(node, own_kube, own_namespace, "after")
    finally:
        node.stop()
        relay.close()


def through_relay(kubeconfig: Path, port: int) -> None:
    """Point the daemon's kubeconfig at the relay (same address, so the server's certificate holds)."""
    config = yaml.safe_load(kubeconfig.read_text())
    for entry in config["clusters"]:
        entry["cluster"]["server"] = f"https://127.0.0.1:{port}"
    kubeconfig.write_text(yaml.safe_dump(config))


def test_a_daemon_starting_after_a_reboot_without_the_api_server_serves_and_rebuilds_once_it_is_back(
    own_cluster: LocalCluster, own_kube: client.ApiClient, own_namespace: str, node: DriverNode
) -> None:
    """After a reboot the daemon checks every prepared claim against the API before it trusts its
    state; a whole cluster coming back up may bring the node before the API server. The daemon then
    starts anyway, stays up, says it is rebuilding, keeps the claims' files, and rebuilds once the
    server answers (it used to exit and crash-loop)."""
    running = serving_a_share(node, own_kube, own_namespace)
    node.stop()
    node.reboot()
    own_cluster.stop_api_server()
    try:
        node.start()
        poll_until(
            lambda: "rebuilding the prepared claims" in ready_reasons(node),
            OUTAGE_SECONDS,
            "the daemon to say so",
        )
        assert node.get("/healthz") == (200, "ok\n")
        assert node.process is not None
        assert node.process.running(), node.process.log_tail()
        assert limits_of(node, running) is not None, "nothing is removed while the API cannot say"
    finally:
        own_cluster.resume_api_server()

    poll_until(
        lambda: "rebuilding" not in ready_reasons(node),
        SCHEDULER_RECOVERY_SECONDS,
        "the rebuild once the API answers",
    )
    assert limits_of(node, running) is not None, "the claim still allocated here is prepared again"
    a_new_pod_is_prepared(node, own_kube, own_namespace, "after")
