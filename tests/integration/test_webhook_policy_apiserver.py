"""The administrator's admission policy through the real API server, as a user meets it with
``kubectl create``: ``nvidia.com/priority: 0`` refused outside the namespaces the chart's
webhook.highPriorityNamespaces grants, with the sentence, and granted inside; the annotation form
answered with a warning; and webhook.seccomp: a GPU container without a profile stored with
RuntimeDefault, one asking Unconfined refused with the sentence, and in warn mode both created
unchanged with a warning.

The bed: one kubelet-less node whose daemon publishes one simulated 80 GiB GPU, so the webhook's
fleet rules pass; the pods are bound to no node, so none is ever scheduled.
"""

from __future__ import annotations

import dataclasses
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client

from tessera.kube import raw_json
from tessera.quantity import GiB
from tessera.webhook import seccomp
from tessera.webhook.admission import AdmissionPolicy
from testbed.cluster import LocalCluster
from testbed.driver_node import DriverNode, ensure_device_class
from testbed.fake_nodes import create_ready_node
from testbed.kubectl import kubectl_argv
from testbed.names import unique_name
from testbed.polling import poll_until
from tests.conftest import made_namespace
from tests.integration.webhook_bed import RunningWebhook

pytestmark = pytest.mark.integration

DENIED = 'admission webhook "pods.gpu.tessera.dev" denied the request: '


@dataclass
class Bed:
    webhook: RunningWebhook
    granted: str
    """A namespace the webhook grants priority 0."""


@pytest.fixture(scope="module")
def bed(cluster: LocalCluster, kube: client.ApiClient) -> Iterator[Bed]:
    ensure_device_class(kube)
    node_name = unique_name("node")
    create_ready_node(kube, node_name, None)
    gpus = DriverNode(cluster, node_name, gpus=1, memory_bytes=80 * GiB)
    gpus.start()
    try:
        gpus.wait_published()
        with made_namespace(kube) as granted:
            webhook = RunningWebhook(kube, cluster, policy=AdmissionPolicy(frozenset({granted})))
            try:
                poll_until(lambda: webhook.cache.fleet.memory_sizes, 30, "the webhook's cache to see the GPU")
                webhook.wait_effective(granted)
                yield Bed(webhook, granted)
            finally:
                webhook.stop()
    finally:
        gpus.cleanup()
        client.CoreV1Api(kube).delete_node(node_name)


@pytest.fixture
def ns(bed: Bed, namespace: str) -> str:
    """A namespace not granted priority 0, once the API server calls the webhook for it."""
    bed.webhook.wait_effective(namespace)
    return namespace


def gpu_pod(
    name: str, limits: dict[str, Any] | None = None, profile: str | None = None, **metadata: Any
) -> dict[str, Any]:
    """A pod written for HAMi, for no node: one container ``main`` asking ``limits`` (1000 MiB of
    one GPU by default), with ``profile`` as its own seccomp profile when given."""
    main: dict[str, Any] = {
        "name": "main",
        "image": "tessera.local/none",
        "resources": {"limits": limits or {"nvidia.com/gpu": "1", "nvidia.com/gpumem": "1000"}},
    }
    if profile is not None:
        main["securityContext"] = {"seccompProfile": {"type": profile}}
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, **metadata},
        "spec": {"nodeSelector": {"kubernetes.io/hostname": "nowhere"}, "containers": [main]},
    }


def kubectl_create(
    cluster: LocalCluster, namespace: str, body: dict[str, Any], folder: Path
) -> tuple[subprocess.CompletedProcess[str], list[str]]:
    """``kubectl create`` of ``body``, and the warnings it printed."""
    manifest = folder / f"{body['metadata']['name']}.yaml"
    manifest.write_text(yaml.safe_dump(body))
    argv = kubectl_argv(cluster.admin_kubeconfig, "create", "-n", namespace, "-f", str(manifest))
    done = subprocess.run(argv, capture_output=True, text=True, timeout=60, check=False)
    warnings = [
        line.removeprefix("Warning: ") for line in done.stderr.splitlines() if line.startswith("Warning: ")
    ]
    return done, warnings


def stored_main(kube: client.ApiClient, namespace: str, name: str) -> dict[str, Any]:
    pod = raw_json(client.CoreV1Api(kube).read_namespaced_pod(name, namespace, _preload_content=False))
    (main,) = pod["spec"]["containers"]
    return dict(main)


def test_priority_0_is_refused_outside_the_granted_namespaces_with_the_sentence_and_granted_inside(
    bed: Bed, cluster: LocalCluster, kube: client.ApiClient, ns: str, tmp_path: Path
) -> None:
    high = {"nvidia.com/gpu": "1", "nvidia.com/gpumem": "1000", "nvidia.com/priority": "0"}
    done, _ = kubectl_create(cluster, ns, gpu_pod("high", high), tmp_path)
    assert done.returncode != 0
    assert (
        f'{DENIED}container "main": nvidia.com/priority 0 (high) is granted only to namespaces an '
        "administrator lists in the chart value webhook.highPriorityNamespaces, and namespace "
        f'"{ns}" is not listed.'
    ) in done.stderr, done.stderr

    done, _ = kubectl_create(cluster, bed.granted, gpu_pod("high", high), tmp_path)
    assert done.returncode == 0, done.stderr
    templates = raw_json(
        client.ResourceV1Api(kube).list_namespaced_resource_claim_template(
            bed.granted, _preload_content=False
        )
    )["items"]
    configs = [t["spec"]["spec"]["devices"].get("config") for t in templates]
    parameters = [c[0]["opaque"]["parameters"] for c in configs if c]
    assert {"apiVersion": "gpu.tessera.dev/v1", "kind": "ShareConfig", "priority": 0} in parameters


def test_the_priority_annotation_is_answered_with_a_warning_naming_the_resource_form(
    bed: Bed, cluster: LocalCluster, ns: str, tmp_path: Path
) -> None:
    done, warnings = kubectl_create(
        cluster, ns, gpu_pod("annotated", annotations={"nvidia.com/priority": "0"}), tmp_path
    )
    assert done.returncode == 0, done.stderr
    assert (
        "annotation nvidia.com/priority is not read; the container resource nvidia.com/priority (in "
        "resources.limits, 0 high or 1 low) is the one honoured."
    ) in warnings, done.stderr


def test_enforce_stores_runtime_default_on_a_container_without_a_profile_and_refuses_unconfined(
    bed: Bed, cluster: LocalCluster, kube: client.ApiClient, ns: str, tmp_path: Path
) -> None:
    done, warnings = kubectl_create(cluster, ns, gpu_pod("plain"), tmp_path)
    assert done.returncode == 0 and warnings == [], done.stderr
    assert stored_main(kube, ns, "plain")["securityContext"] == {"seccompProfile": {"type": "RuntimeDefault"}}

    done, _ = kubectl_create(cluster, ns, gpu_pod("unconfined", profile="Unconfined"), tmp_path)
    assert done.returncode != 0
    assert (
        f'{DENIED}container "main": seccomp profile "Unconfined", set on the container, would let it leave '
        "its GPU share's limits through a user namespace (unshare); ask RuntimeDefault or Localhost, or ask "
        "an administrator about the chart value webhook.seccomp."
    ) in done.stderr, done.stderr


def test_warn_creates_both_unchanged_with_a_warning(
    bed: Bed, cluster: LocalCluster, kube: client.ApiClient, ns: str, tmp_path: Path
) -> None:
    """The same server with webhook.seccomp warn (its policy is read at each review)."""
    enforcing = bed.webhook.app.policy
    bed.webhook.app.policy = dataclasses.replace(enforcing, seccomp=seccomp.WARN)
    try:
        for name, profile in (("plain", None), ("unconfined", "Unconfined")):
            done, warnings = kubectl_create(cluster, ns, gpu_pod(name, profile=profile), tmp_path)
            assert done.returncode == 0, done.stderr
            assert (
                'container "main": it runs without a RuntimeDefault or Localhost seccomp profile, so it '
                "could leave its GPU share's limits through a user namespace (unshare); set "
                "securityContext.seccompProfile.type RuntimeDefault."
            ) in warnings, done.stderr
            expected = None if profile is None else {"seccompProfile": {"type": profile}}
            assert stored_main(kube, ns, name).get("securityContext") == expected
    finally:
        bed.webhook.app.policy = enforcing
