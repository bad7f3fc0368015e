"""Live figures from the exporters, where the caller can reach them: memory in use and busy time per
GPU and per claim (docs/metrics.md).

The exporter runs as a DaemonSet with no Service a laptop can reach, so each exporter pod is read
through the API server's pod proxy, the way ``kubectl get --raw`` would, with the caller's own
credentials. Nothing here is required: a view without figures says so, and a cluster whose RBAC or
network policy keeps the caller from the proxy still gets every other column.

Exporters are looked for in the chart release's namespace only. Any namespace's pod may carry the
exporter's labels and a port named ``metrics``, and one a tenant made would feed the views figures
of its choosing (memory in use, busy time) for any claim. The release's namespace is Helm's
annotation on the cluster-scoped DeviceClass the chart makes, which only a cluster administrator can
write, unless ``--exporter-namespace`` names it.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any

from kubernetes import client
from kubernetes.client import ApiException
from prometheus_client.parser import text_string_to_metric_families
from urllib3.exceptions import HTTPError

from tessera.kube import raw_json
from tessera.names import DEVICE_CLASS

log = logging.getLogger(__name__)

EXPORTER_SELECTOR = "app.kubernetes.io/name=tessera,app.kubernetes.io/component=exporter"
"""The chart's labels on exporter pods (charts/tessera/templates/_helpers.tpl selectorLabels)."""

METRICS_PORT_NAME = "metrics"

RELEASE_NAMESPACE_ANNOTATION = "meta.helm.sh/release-namespace"
"""Helm's annotation on every object of a release: the release's namespace."""

MAX_BODY = 16 << 20
"""Bytes of one exporter's answer read at most: a scrape of a busy node is well under a megabyte."""

ClaimKey = tuple[str, str, str]
"""(namespace, claim, GPU UUID)"""


@dataclass
class Usage:
    """What the reachable exporters said; ``reached`` of ``exporters`` answered."""

    gpu_memory: dict[str, float] = field(default_factory=dict)
    gpu_busy: dict[str, float] = field(default_factory=dict)
    claim_memory: dict[ClaimKey, float] = field(default_factory=dict)
    claim_busy: dict[ClaimKey, float] = field(default_factory=dict)
    exporters: int = 0
    reached: int = 0
    namespace: str | None = None
    """Where the exporters were looked for; None when no namespace was found (nothing was read)."""


_GPU_FAMILIES = {"tessera_gpu_memory_used_bytes": "gpu_memory", "tessera_gpu_utilization_ratio": "gpu_busy"}
_CLAIM_FAMILIES = {
    "tessera_container_gpu_memory_used_bytes": "claim_memory",
    "tessera_container_gpu_utilization_ratio": "claim_busy",
}


def read_metrics(text: str, into: Usage) -> None:
    """Add one exporter's exposition to ``into``. A claim's containers each carry the claim's
    figure (docs/metrics.md), so a claim's value is the largest of its series, not their sum."""
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            labels = sample.labels
            if sample.name in _GPU_FAMILIES:
                getattr(into, _GPU_FAMILIES[sample.name])[labels.get("device_uuid", "")] = sample.value
            elif sample.name in _CLAIM_FAMILIES:
                figures = getattr(into, _CLAIM_FAMILIES[sample.name])
                key = (labels.get("namespace", ""), labels.get("claim", ""), labels.get("device_uuid", ""))
                figures[key] = max(figures.get(key, 0.0), sample.value)


def release_namespace(device_class: dict[str, Any]) -> str | None:
    """The namespace of the Helm release that made ``device_class`` (the chart's), or None."""
    annotations = (device_class.get("metadata") or {}).get("annotations") or {}
    namespace = annotations.get(RELEASE_NAMESPACE_ANNOTATION)
    return str(namespace) if namespace else None


def exporter_namespace(api: client.ApiClient) -> str | None:
    """The chart release's namespace, from the DeviceClass it made; None when it cannot be read or
    was not made by Helm (``deviceClass.enabled: false``)."""
    try:
        found = raw_json(client.ResourceV1Api(api).read_device_class(DEVICE_CLASS, _preload_content=False))
    except (ApiException, HTTPError) as error:
        log.debug("DeviceClass %s not read: %s", DEVICE_CLASS, error)
        return None
    return release_namespace(found)


def scrape(
    api: client.ApiClient,
    namespace: str | None = None,
    selector: str = EXPORTER_SELECTOR,
    timeout: float = 5.0,
) -> Usage:
    """Every running exporter's figures in ``namespace`` (default: the chart release's, the module
    says why no other), through the API server's pod proxy; exporters that cannot be listed or
    reached are counted, not raised."""
    core = client.CoreV1Api(api)
    usage = Usage(namespace=namespace or exporter_namespace(api))
    if usage.namespace is None:
        return usage
    try:
        listed = core.list_namespaced_pod(usage.namespace, label_selector=selector, _preload_content=False)
        pods = raw_json(listed).get("items") or []
    except (ApiException, HTTPError) as error:
        log.debug("exporters not listed: %s", error)
        return usage
    for pod in pods:
        if (pod.get("status") or {}).get("phase") != "Running":
            continue
        usage.exporters += 1
        metadata = pod["metadata"]
        port = metrics_port(pod)
        if port is None:
            log.debug("exporter %s has no port named %s", metadata["name"], METRICS_PORT_NAME)
            continue
        try:
            response: Any = core.connect_get_namespaced_pod_proxy_with_path(
                f"{metadata['name']}:{port}",
                metadata["namespace"],
                "metrics",
                _preload_content=False,
                _request_timeout=(timeout, timeout),
            )
            body = response.read(MAX_BODY)
            read_metrics(body.decode("utf-8", "replace"), usage)
        except (ApiException, HTTPError, ValueError) as error:
            log.debug("exporter %s not read: %s", metadata["name"], error)
            continue
        usage.reached += 1
    return usage


def metrics_port(pod: dict[str, Any]) -> int | None:
    """The number of the pod's port named ``metrics``. The pod proxy is asked by number: the API
    server does not resolve a pod's named port (it does a Service's), and kube-apiserver 1.37 fails
    such a request with a panic and a closed connection instead of an error."""
    for container in (pod.get("spec") or {}).get("containers") or []:
        for entry in container.get("ports") or []:
            if entry.get("name") == METRICS_PORT_NAME and isinstance(entry.get("containerPort"), int):
                return int(entry["containerPort"])
    return None


def add_to_gpus(rows: list[dict[str, Any]], usage: Usage) -> None:
    """Each GPU row (views.gpu_rows) and its shares with the figures the exporters gave for them."""
    for row in rows:
        if row["uuid"] in usage.gpu_memory:
            row["memoryUsed"] = usage.gpu_memory[row["uuid"]]
        if row["uuid"] in usage.gpu_busy:
            row["busy"] = usage.gpu_busy[row["uuid"]]
        for share in row["shares"]:
            _add(share, usage, (share["namespace"], share["claim"], row["uuid"]))


def add_to_shares(rows: list[dict[str, Any]], usage: Usage) -> None:
    """Each share row (views.share_rows) with the figures the exporters gave for its claim's GPU."""
    for row in rows:
        _add(row, usage, (row["namespace"], row["claim"], row["uuid"]))


def _add(row: dict[str, Any], usage: Usage, key: ClaimKey) -> None:
    if key in usage.claim_memory:
        row["memoryUsed"] = usage.claim_memory[key]
    if key in usage.claim_busy:
        row["busy"] = usage.claim_busy[key]
