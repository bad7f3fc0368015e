"""One read of the API objects the views need, as plain JSON, each kind listed once.

A view is a picture of one moment: listing every kind once, up front, and judging from that copy
keeps a GPU's shares and its free capacity from two different moments. Kinds the caller may not
read, or that the cluster does not serve (no DeviceTaintRules before Kubernetes 1.35, no Kueue),
are empty, and ``missing`` says which, so a view can say what it could not see.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from kubernetes import client
from kubernetes.client import ApiException

from tessera.admissioncheck.inventory import KUEUE_GROUP, KUEUE_VERSION
from tessera.kube import raw_json
from tessera.names import DRIVER_NAME

Obj = dict[str, Any]


@dataclass
class Snapshot:
    """The objects of one moment. ``namespace`` is the namespace pods and claims were read from
    (None: all)."""

    slices: list[Obj] = field(default_factory=list)
    taint_rules: list[Obj] = field(default_factory=list)
    claims: list[Obj] = field(default_factory=list)
    templates: list[Obj] = field(default_factory=list)
    pods: list[Obj] = field(default_factory=list)
    nodes: list[Obj] = field(default_factory=list)
    workloads: list[Obj] = field(default_factory=list)
    admission_checks: list[Obj] = field(default_factory=list)
    missing: list[str] = field(default_factory=list)


def listed(what: str, call: Callable[..., Any], missing: list[str], **kwargs: Any) -> list[Obj]:
    """The items of one list call; a kind that is forbidden or not served is recorded in
    ``missing`` and read as empty. Any other failure is the caller's."""
    try:
        return list(raw_json(call(_preload_content=False, **kwargs)).get("items") or [])
    except ApiException as error:
        if error.status in (403, 404):
            missing.append(what)
            return []
        raise


def read(api: client.ApiClient, namespace: str | None, kinds: frozenset[str]) -> Snapshot:
    """The objects of ``kinds`` (field names of :class:`Snapshot`); claims, templates and pods
    of ``namespace`` only, or of every namespace when it is None. Claims are always read cluster-wide
    when slices are asked for: a GPU's allocated capacity counts every namespace's shares."""
    resource, core, custom = client.ResourceV1Api(api), client.CoreV1Api(api), client.CustomObjectsApi(api)
    out = Snapshot()
    miss = out.missing
    if "slices" in kinds:
        out.slices = listed(
            "resourceslices", resource.list_resource_slice, miss, field_selector=f"spec.driver={DRIVER_NAME}"
        )
        out.taint_rules = listed("devicetaintrules", resource.list_device_taint_rule, miss)
        out.nodes = listed("nodes", core.list_node, miss)
        out.claims = listed("resourceclaims", resource.list_resource_claim_for_all_namespaces, miss)
    elif "claims" in kinds:
        out.claims = _namespaced(
            "resourceclaims",
            resource.list_namespaced_resource_claim,
            resource.list_resource_claim_for_all_namespaces,
            namespace,
            miss,
        )
    if "pods" in kinds:
        out.pods = _namespaced(
            "pods", core.list_namespaced_pod, core.list_pod_for_all_namespaces, namespace, miss
        )
    if "templates" in kinds:
        out.templates = _namespaced(
            "resourceclaimtemplates",
            resource.list_namespaced_resource_claim_template,
            resource.list_resource_claim_template_for_all_namespaces,
            namespace,
            miss,
        )
    if "workloads" in kinds:
        out.admission_checks = listed(
            "admissionchecks",
            lambda **kw: custom.list_cluster_custom_object(
                KUEUE_GROUP, KUEUE_VERSION, "admissionchecks", **kw
            ),
            miss,
        )
        if namespace is None:
            out.workloads = listed(
                "workloads",
                lambda **kw: custom.list_cluster_custom_object(KUEUE_GROUP, KUEUE_VERSION, "workloads", **kw),
                miss,
            )
        else:
            out.workloads = listed(
                "workloads",
                lambda **kw: custom.list_namespaced_custom_object(
                    KUEUE_GROUP, KUEUE_VERSION, namespace, "workloads", **kw
                ),
                miss,
            )
    return out


def _namespaced(
    what: str,
    in_namespace: Callable[..., Any],
    everywhere: Callable[..., Any],
    namespace: str | None,
    missing: list[str],
) -> list[Obj]:
    if namespace is None:
        return listed(what, everywhere, missing)
    return listed(what, lambda **kw: in_namespace(namespace, **kw), missing)
