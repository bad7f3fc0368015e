"""`helm upgrade` from one build of Tessera to the next with shares running: every component's pods
are replaced, running containers keep their limits and their metrics, and GPU pods created all
through the upgrade are admitted, placed and prepared.

The two builds are this checkout built twice, the first under an earlier version
(testbed/product_images.py builds the package and tags the images at a version it is given), so the
upgrade changes every image and rolls every workload of the release. The first is installed with
the webhook's certificate made by the chart (`webhook.tls.source: chart`, the default before
`secret`), so the upgrade also moves the webhook to the certificate its replicas keep: the caBundle
the API server trusts must never stop trusting what some replica serves, or GPU pods are refused.
There is no earlier release to upgrade from yet; when there is, its chart and images are the first
build to use.
"""

from __future__ import annotations

import base64
import threading
from collections.abc import Iterator
from functools import partial

import pytest
from cryptography import x509
from kubernetes import client

from tessera.kube import raw_json
from testbed import chart_bed as charts
from testbed.chart_bed import (
    ROLLOUT_TIMEOUT,
    ChartBed,
    enforcement_script,
    node_address,
    wait_rolled_out,
)
from testbed.cluster import LocalCluster
from testbed.helm import CHART, values_file
from testbed.node import NodeFactory
from testbed.pod_state import sections, wait_for_pod
from testbed.pod_stream import HAMI_SHARE as SHARE
from testbed.pod_stream import PodStream, hami_pod, in_metrics, running_with_its_share
from testbed.polling import poll_until
from testbed.product_images import load_manifest, product_images, project_version

pytestmark = pytest.mark.e2e

PREVIOUS = "0.1.0.dev0"
"""The first build's version: earlier than the checkout's (pyproject.toml), a valid image tag."""

NEW_POD_EVERY = 5.0
"""Seconds between the GPU pods created while the upgrade runs."""


@pytest.fixture(scope="module")
def upgrade_bed(
    cluster: LocalCluster,
    kube: client.ApiClient,
    node_factory: NodeFactory,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[ChartBed]:
    """The release installed from the first build, on two nodes that hold both builds' images."""
    images = [*product_images(version=PREVIOUS).values(), *product_images().values()]
    workloads = charts.workload_images(tmp_path_factory.mktemp("workload-images"))
    nodes = node_factory.start(2, extra_images=[*images, *workloads])
    charts.prepare_nodes(cluster, kube, nodes)
    home = tmp_path_factory.mktemp("helm")
    values = charts.chart_values(PREVIOUS)
    values["webhook"]["tls"] = {"source": "chart"}
    with charts.installed_release(cluster, kube, nodes, home, values) as bed:
        yield bed


def uid_of(core: client.CoreV1Api, namespace: str, name: str) -> str | None:
    metadata = core.read_namespaced_pod(name, namespace).metadata
    return metadata.uid if metadata is not None else None


def ca_bundle_of(bed: ChartBed) -> bytes:
    """The CAs (PEM) the API server trusts for the release's webhook: its configuration's caBundle."""
    configuration = raw_json(
        client.AdmissionregistrationV1Api(bed.kube).read_mutating_webhook_configuration(
            f"{bed.release}-webhook", _preload_content=False
        )
    )
    [bundle] = {w["clientConfig"].get("caBundle", "") for w in configuration["webhooks"]}
    assert bundle, "a webhook without a caBundle: the API server trusts no certificate"
    return base64.b64decode(bundle)


def wait_gone(bed: ChartBed, component: str, old: set[str]) -> None:
    """Until none of a component's old pods is left. A finished rollout may still list one that is
    terminating: the webhook drains for a few seconds after SIGTERM, and its pod stays until then."""

    def none_left() -> bool:
        return not {p["metadata"]["uid"] for p in bed.pods(component)} & old

    poll_until(none_left, ROLLOUT_TIMEOUT, f"the {component}'s pods of the first build to end")


def images_of(bed: ChartBed, component: str) -> set[str]:
    return {c["image"] for p in bed.pods(component) for c in p["spec"]["containers"]}


def test_an_upgrade_with_shares_running_keeps_their_limits_and_metrics_and_admits_pods_throughout(
    upgrade_bed: ChartBed, namespace: str
) -> None:
    bed = upgrade_bed
    wait_rolled_out(bed)
    manifest = load_manifest()
    first = {f"tessera.local/{manifest.images['driver'].repository}:{PREVIOUS}"}
    assert images_of(bed, "kubeletplugin") == first
    core = client.CoreV1Api(bed.kube)
    running = [f"running-{i}" for i in range(2)]
    for name in running:
        core.create_namespaced_pod(namespace, hami_pod(name))
    for name in running:
        wait_for_pod(
            core,
            namespace,
            name,
            partial(running_with_its_share, bed.kube, namespace, name),
            ROLLOUT_TIMEOUT,
            f"{name} running",
        )
    before = {name: uid_of(core, namespace, name) for name in running}
    chart_ca = ca_bundle_of(bed)
    old_daemons = {p["metadata"]["uid"] for p in bed.pods("kubeletplugin")}
    old_webhooks = {p["metadata"]["uid"] for p in bed.pods("webhook")}

    # Every pod of the stream must run with its share, so the stream stops when the GPUs are full:
    # on a loaded machine the upgrade lasts longer than their room for 25 % shares, one pod a step.
    slots = len(bed.nodes) * charts.GPUS_PER_NODE * (100 // SHARE.cores) - len(running)
    with PodStream(bed.kube, namespace, NEW_POD_EVERY, limit=slots) as through:
        upgraded = charts.chart_values()
        # The chart's CA must still be trusted when checked below, long after the rollout began.
        upgraded["webhook"]["tls"] = {"secret": {"settleSeconds": 3600}}
        values = charts.confined_to_release_nodes(
            charts.with_webhook_client_ca(bed.cluster, upgraded), bed.release
        )
        bed.helm(
            "upgrade", bed.release, str(CHART), "-f", str(values_file(bed.helm_home, values, "upgrade.yaml"))
        )
        wait_rolled_out(bed)
        threading.Event().wait(2 * NEW_POD_EVERY)  # a few more pods once the new release serves

    # The replicas' own CA is trusted now, and the chart's still is: it goes once every replica has
    # served the new certificate for a while (webhook.tls.secret.settleSeconds).
    trusted = ca_bundle_of(bed)
    shared = raw_json(
        core.read_namespaced_secret(
            f"{bed.release}-webhook-shared-tls", bed.namespace, _preload_content=False
        )
    )
    assert base64.b64decode(shared["data"]["ca.crt"]) == trusted
    chart_cas, trusted_cas = (set(x509.load_pem_x509_certificates(b)) for b in (chart_ca, trusted))
    assert chart_cas < trusted_cas

    current = f"tessera.local/{manifest.images['driver'].repository}:{project_version()}"
    assert images_of(bed, "kubeletplugin") == {current}
    wait_gone(bed, "kubeletplugin", old_daemons)
    wait_gone(bed, "webhook", old_webhooks)
    assert through.refused == [], "no GPU pod refused while the release was upgraded"
    assert through.unconverted == [], "every GPU pod converted by the webhook"
    assert len(through.created) >= 3, through.created
    for name in through.created:
        wait_for_pod(
            core,
            namespace,
            name,
            partial(running_with_its_share, bed.kube, namespace, name),
            ROLLOUT_TIMEOUT,
            f"{name}, created during the upgrade, running with its share",
        )

    for name in running:
        pod = core.read_namespaced_pod(name, namespace)
        assert pod.metadata is not None and pod.status is not None and pod.spec is not None
        assert pod.metadata.uid == before[name]
        assert [c.restart_count for c in pod.status.container_statuses or []] == [0]
        seen = sections(
            bed.kubectl("exec", "-n", namespace, name, "--", "sh", "-c", enforcement_script(SHARE.memory))
        )
        assert int(seen["info"]["total"]) == SHARE.memory, seen
        assert seen["over"]["rc"] == "2", seen
        address = node_address(bed, str(pod.spec.node_name))
        poll_until(partial(in_metrics, address, name), 60, f"{name} in the new exporter's metrics")


def test_the_first_build_is_this_tree_at_an_earlier_version() -> None:
    """The two builds differ by version only, so the upgrade changes every image."""
    previous, current = product_images(version=PREVIOUS), product_images()
    assert set(previous) == set(current)
    assert all(previous[name].name != current[name].name for name in previous)
    assert all(PREVIOUS in previous[name].name for name in previous)
