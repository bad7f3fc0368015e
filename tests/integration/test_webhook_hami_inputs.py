"""Every HAMi input of docs/webhook.md's table, sent through the real API server as a user sends it
(``kubectl create``): a honoured row is created converted and silent, a warned row is created with
the row's message printed as ``Warning: ...``, a refused row is denied with it. The claims that
honour MIG and binpack are allocated by the real scheduler, and the API hands the ShareConfig and
MIG templates back as a second replica must find them.

The bed: one node whose daemon publishes two simulated 80 GiB GPUs, and a kubelet-less node whose
ResourceSlice, written by hand as the driver publishes MIG instances (CONTRACTS: type "mig",
profile, uuid, parentUUID, memory), holds instances of profiles 1g.10gb and 3g.40gb. The table's
pods are bound to no node, so they never take a GPU from the other tests.
"""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client

from tessera.gpu_request import Selection, read_mig, read_request
from tessera.kube import raw_json
from tessera.names import DRIVER_NAME
from tessera.quantity import GiB
from tessera.webhook.conversion import claim_template, mig_claim_template
from tessera.webhook.mutation import converted_resource
from tessera.webhook.templates import TemplateStore
from testbed import pod_state
from testbed.cluster import LocalCluster
from testbed.driver_node import DriverNode, ensure_device_class, ensure_mig_device_class
from testbed.fake_nodes import create_ready_node
from testbed.kubectl import kubectl_argv
from testbed.names import unique_name
from testbed.polling import poll_until
from tests.conftest import made_namespace
from tests.integration.webhook_bed import RunningWebhook
from tests.unit.webhook.hami_table import Row, pod_of, rows

pytestmark = pytest.mark.integration

MIG_PROFILES = ("1g.10gb", "3g.40gb")


@dataclass
class Bed:
    webhook: RunningWebhook
    gpus: DriverNode
    mig_node: str


def mig_slice(node: str) -> dict[str, Any]:
    devices = [
        {
            "name": f"mig-{index}",
            "attributes": {
                "type": {"string": "mig"},
                "profile": {"string": profile},
                "uuid": {"string": f"MIG-0000000{index}-0000-0000-0000-000000000000"},
                "parentUUID": {"string": "GPU-99999999-0000-0000-0000-000000000000"},
                "productName": {"string": "NVIDIA A100-SXM4-80GB"},
                "index": {"int": 0},
            },
            "capacity": {"memory": {"value": f"{profile.split('.')[1][:-2]}Gi"}},
        }
        for index, profile in enumerate(MIG_PROFILES)
    ]
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceSlice",
        "metadata": {"name": unique_name("mig")},
        "spec": {
            "driver": DRIVER_NAME,
            "nodeName": node,
            "pool": {"name": node, "generation": 1, "resourceSliceCount": 1},
            "devices": devices,
        },
    }


@pytest.fixture(scope="module")
def bed(cluster: LocalCluster, kube: client.ApiClient) -> Iterator[Bed]:
    ensure_device_class(kube)
    ensure_mig_device_class(kube)
    resource = client.ResourceV1Api(kube)
    gpu_node, mig_node = unique_name("node"), unique_name("node")
    for name in (gpu_node, mig_node):
        create_ready_node(kube, name, None)
    gpus = DriverNode(cluster, gpu_node, gpus=2, memory_bytes=80 * GiB)
    gpus.start()
    gpus.wait_published()
    published = mig_slice(mig_node)
    resource.create_resource_slice(client.V1ResourceSlice.model_validate(published))
    webhook = RunningWebhook(kube, cluster)
    try:
        poll_until(
            lambda: (
                webhook.cache.fleet.mig_profiles == set(MIG_PROFILES)
                and sum(webhook.cache.fleet.products.values()) == 2
            ),
            30,
            "the webhook's cache to see the GPUs and the MIG instances",
        )
        yield Bed(webhook, gpus, mig_node)
    finally:
        webhook.stop()
        gpus.cleanup()
        resource.delete_resource_slice(published["metadata"]["name"])
        for name in (gpu_node, mig_node):
            client.CoreV1Api(kube).delete_node(name)


@pytest.fixture(scope="module")
def table_namespace(bed: Bed, kube: client.ApiClient) -> Iterator[str]:
    with made_namespace(kube) as name:
        bed.webhook.wait_effective(name)
        yield name


ROWS = rows()


def kubectl_create(
    cluster: LocalCluster, namespace: str, body: dict[str, Any], folder: Path
) -> subprocess.CompletedProcess[str]:
    manifest = folder / f"{body['metadata']['name']}.yaml"
    manifest.write_text(yaml.safe_dump(body))
    argv = kubectl_argv(cluster.admin_kubeconfig, "create", "-n", namespace, "-f", str(manifest))
    return subprocess.run(argv, capture_output=True, text=True, timeout=60, check=False)


@pytest.mark.parametrize("index", range(len(ROWS)), ids=[row.id for row in ROWS])
def test_kubectl_shows_each_rows_answer(
    index: int, cluster: LocalCluster, kube: client.ApiClient, table_namespace: str, tmp_path: Path
) -> None:
    row: Row = ROWS[index]
    name = f"row-{index}"
    done = kubectl_create(cluster, table_namespace, pod_of(row, name, node="nowhere"), tmp_path)
    warnings = [
        line.removeprefix("Warning: ") for line in done.stderr.splitlines() if line.startswith("Warning: ")
    ]
    if row.answer == "refused":
        assert done.returncode != 0
        assert 'admission webhook "pods.gpu.tessera.dev" denied the request' in done.stderr
        assert row.message in done.stderr, done.stderr
        return
    assert done.returncode == 0, done.stderr
    if row.answer == "honoured":
        assert warnings == [], done.stderr
    else:
        assert any(row.message in warning for warning in warnings), done.stderr
    stored = raw_json(
        client.CoreV1Api(kube).read_namespaced_pod(name, table_namespace, _preload_content=False)
    )
    (main,) = stored["spec"]["containers"]
    assert not [key for key in main["resources"].get("limits", {}) if converted_resource(key)]
    assert main["resources"]["claims"] == [{"name": "tessera-main"}]
    assert stored["spec"]["resourceClaims"][0]["resourceClaimTemplateName"].startswith("tessera-")


def test_a_mig_pod_gets_an_instance_of_its_profile_from_the_scheduler(
    bed: Bed, kube: client.ApiClient, namespace: str
) -> None:
    bed.webhook.wait_effective(namespace)
    core, resource = client.CoreV1Api(kube), client.ResourceV1Api(kube)
    body = pod_of(Row("", {"nvidia.com/mig-3g.40gb": "1"}, {}, {}, {}, "honoured", ""), "mig")
    core.create_namespaced_pod(namespace, client.V1Pod.model_validate(body))
    claim = pod_state.wait_until_claim_allocated(resource, core, namespace, "mig", "tessera-main")
    result = pod_state.single_allocation_result(claim)
    assert (result.pool, result.device, result.request) == (bed.mig_node, "mig-1", "mig")
    assert pod_state.wait_until_bound(core, namespace, "mig") == bed.mig_node


def test_binpack_is_the_allocators_first_fit_two_shares_share_the_first_gpu(
    bed: Bed, kube: client.ApiClient, namespace: str
) -> None:
    """hami.io/gpu-scheduler-policy binpack is honoured without a word: the allocator takes the first
    GPU of the node's slice that has room, so two small shares land on one GPU, not one each."""
    bed.webhook.wait_effective(namespace)
    core, resource = client.CoreV1Api(kube), client.ResourceV1Api(kube)
    row = Row(
        "",
        {"nvidia.com/gpumem": "10000"},
        {"hami.io/gpu-scheduler-policy": "binpack"},
        {},
        {},
        "honoured",
        "",
    )
    devices = []
    for name in ("first", "second"):
        body = pod_of(row, name, node=bed.gpus.node_name)
        core.create_namespaced_pod(namespace, client.V1Pod.model_validate(body))
        claim = pod_state.wait_until_claim_allocated(resource, core, namespace, name, "tessera-main")
        devices.append(pod_state.single_allocation_result(claim).device)
    published = bed.gpus.wait_published()["spec"]["devices"]
    assert devices == [published[0]["name"]] * 2


def test_a_second_replica_accepts_the_share_config_and_mig_templates_the_api_stored(
    bed: Bed, namespace: str
) -> None:
    """A replica that meets AlreadyExists reads the template back and uses it only if the stored
    spec is the one it writes: the API must hand back the ShareConfig and the MIG claim unchanged."""
    fleet = bed.webhook.cache.fleet
    env = [{"name": "CUDA_DISABLE_CONTROL", "value": "true"}]
    share = read_request(
        "c",
        {
            "name": "c",
            "env": env,
            "resources": {"limits": {"nvidia.com/priority": "0", "nvidia.com/gpu": "1"}},
        },
    )
    assert share is not None and share.priority == 0 and not share.enforce
    mig = read_mig("c", {"name": "c", "resources": {"limits": {"nvidia.com/mig-1g.10gb": "1"}}})
    assert mig is not None
    templates = [
        claim_template(namespace, "c", share, fleet),
        mig_claim_template(namespace, mig, Selection()),
    ]
    for template in templates:
        assert TemplateStore(bed.webhook.api).ensure(template)
        assert TemplateStore(bed.webhook.api).ensure(template)  # 409, read back, verified
