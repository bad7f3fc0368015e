"""The unshare attack of issue 34 on a real node (kubelet, containerd, runc with seccomp): a tenant
in a pod written for HAMi makes a user and mount namespace of its own (``unshare -Urm``) and mounts
over ``/etc/ld.so.preload``, so the programs it starts next would run without the shim.

Under ``Unconfined`` (what a HAMi pod got before webhook.seccomp, and still gets with ``off``) the
mount succeeds. With the webhook's default ``enforce`` the same pod, which names no profile, is
admitted with ``RuntimeDefault`` and ``unshare`` is refused, while its CUDA program still runs
under the shim.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client

from tessera.kube import raw_json
from tessera.webhook import seccomp
from testbed.cluster import LocalCluster
from testbed.images import TOOLS_PROGRAMS, ImageSpec, build_image, host_program
from testbed.node import NodeFactory, RealNode
from testbed.pod_state import sections
from testbed.shim_harness import PROGRAM_BUILD, SIMGPU_BUILD, build_programs
from tests.e2e.test_driver_node import DONE, one_gpu_node, wait_done
from tests.integration.webhook_bed import RunningWebhook

pytestmark = pytest.mark.e2e

IMAGE = "tessera.local/unshare-attack:v1"

SCRIPT = (
    "echo '== info'; shim_probe info; "
    "echo '== attack'; "
    # In a namespace of its own the tenant is root and may mount over the preload list.
    "unshare -Urm sh -c ': > /tmp/empty && mount --bind /tmp/empty /etc/ld.so.preload "
    "&& echo preload=$(cat /etc/ld.so.preload | wc -c)' 2>&1; echo rc=$?; "
    f"echo '{DONE}'; exec sleep 3600"
)


@pytest.fixture(scope="module")
def attack_image(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tools image plus unshare, mount and wc, and shim_probe for a CUDA program."""
    programs = build_programs(PROGRAM_BUILD, SIMGPU_BUILD)
    files = {f"/bin/{name}": host_program(name) for name in (*TOOLS_PROGRAMS, "unshare", "mount", "wc")}
    files["/bin/shim_probe"] = programs / "shim_probe"
    return build_image(ImageSpec(IMAGE, files, command=("/bin/sh",)), tmp_path_factory.mktemp("images"))


@pytest.fixture(scope="module")
def gpu_node(
    cluster: LocalCluster, kube: client.ApiClient, node_factory: NodeFactory, attack_image: Path
) -> Iterator[RealNode]:
    """One real node with simulated GPUs, the daemon registered and published."""
    with one_gpu_node(cluster, kube, node_factory, attack_image) as made:
        yield made.node


@pytest.fixture(scope="module")
def webhook(cluster: LocalCluster, kube: client.ApiClient, gpu_node: RealNode) -> Iterator[RunningWebhook]:
    running = RunningWebhook(kube, cluster)
    yield running
    running.stop()


def tenant_pod(node: str, name: str, profile: str | None) -> dict[str, Any]:
    """A pod written for HAMi (1000 MiB, 25 % of a GPU) running :data:`SCRIPT`."""
    main: dict[str, Any] = {
        "name": "tenant",
        "image": IMAGE,
        "imagePullPolicy": "Never",
        "command": ["/bin/sh", "-c", SCRIPT],
        "resources": {"limits": {"nvidia.com/gpumem": "1000", "nvidia.com/gpucores": "25"}},
    }
    if profile is not None:
        main["securityContext"] = {"seccompProfile": {"type": profile}}
    return {
        "metadata": {"name": name},
        "spec": {
            "nodeSelector": {"kubernetes.io/hostname": node},
            "restartPolicy": "Never",
            "terminationGracePeriodSeconds": 0,
            "containers": [main],
        },
    }


def run(kube: client.ApiClient, namespace: str, body: dict[str, Any]) -> tuple[dict[str, Any], str]:
    """The pod as stored, and its log once its script printed everything."""
    core = client.CoreV1Api(kube)
    created = raw_json(
        core.create_namespaced_pod(namespace, client.V1Pod.model_validate(body), _preload_content=False)
    )
    return created, wait_done(kube, namespace, body["metadata"]["name"])


def test_unconfined_lets_the_tenant_mount_over_the_preload_and_enforce_refuses_the_unshare(
    gpu_node: RealNode, webhook: RunningWebhook, kube: client.ApiClient, namespace: str
) -> None:
    webhook.wait_effective(namespace)
    enforcing = webhook.app.policy
    webhook.app.policy = dataclasses.replace(enforcing, seccomp=seccomp.OFF)
    try:
        _, log = run(kube, namespace, tenant_pod(gpu_node.name, "unconfined", "Unconfined"))
    finally:
        webhook.app.policy = enforcing
    attack = sections(log)["attack"]
    assert (attack.get("rc"), attack.get("preload")) == ("0", "0"), log  # the preload list is gone
    client.CoreV1Api(kube).delete_namespaced_pod("unconfined", namespace, grace_period_seconds=0)

    created, log = run(kube, namespace, tenant_pod(gpu_node.name, "plain", None))
    assert created["spec"]["containers"][0]["securityContext"] == {
        "seccompProfile": {"type": "RuntimeDefault"}
    }
    seen = sections(log)
    assert seen["attack"]["rc"] != "0" and "preload" not in seen["attack"], log
    assert "Operation not permitted" in log, log
    assert int(seen["info"]["total"]) == 1000 << 20, log  # the shim still runs under RuntimeDefault
