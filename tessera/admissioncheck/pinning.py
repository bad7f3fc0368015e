"""Holding a Ready Workload's pods to the node its shares were planned on.

The check plans every share onto a GPU, but the scheduler places pods on its own: on a dense
cluster it could put an earlier Workload's pods where a later one's shares were planned, and the
later pods would then wait Pending for room the check had promised them (benchmarks/admissioncheck
measured 1-2 pods of 91 doing so on 4 nodes x 8 GPUs). A PodSet whose pods are all planned on one
node is therefore held there: the Ready state carries a ``podSetUpdates`` entry with the nodeSelector
``kubernetes.io/hostname``, which Kueue adds to the pods' template when it starts the job.

A PodSet planned across several nodes is not held (a nodeSelector applies to every pod of the
PodSet); nor is one whose template already selects a hostname (Kueue refuses to start a job whose
update conflicts with its template), nor one on a node whose hostname label differs from its name
(the selector names the node by that label, and the plan knows nodes by name). Pure except
:class:`HostnameLabels`, which reads Nodes.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Mapping, Sequence
from typing import Any

from kubernetes import client
from kubernetes.client import ApiException

from tessera.admissioncheck.fit import Placement

log = logging.getLogger(__name__)

HOSTNAME_LABEL = "kubernetes.io/hostname"

Pins = Mapping[str, str]
"""PodSet name -> the node its pods are held to."""


def single_node_groups(placements: Sequence[Placement]) -> dict[str, str]:
    """PodSet name -> node, for each PodSet whose planned pods all share one node."""
    nodes: dict[str, set[str]] = {}
    for placement in placements:
        if placement.node:
            nodes.setdefault(placement.group, set()).add(placement.node)
    return {group: next(iter(found)) for group, found in nodes.items() if len(found) == 1}


def selects_hostname(workload: Mapping[str, Any], pod_set: str) -> bool:
    """Whether the PodSet's own template already has a hostname nodeSelector."""
    for entry in (workload.get("spec") or {}).get("podSets") or []:
        if entry.get("name") == pod_set:
            spec = (entry.get("template") or {}).get("spec") or {}
            return HOSTNAME_LABEL in (spec.get("nodeSelector") or {})
    return False


def pins_from_state(state: Mapping[str, Any] | None) -> dict[str, str]:
    """The pins a Ready check state carries (its ``podSetUpdates`` hostname selectors); the label
    value is the node's name, since only such nodes are pinned."""
    out: dict[str, str] = {}
    for update in (state or {}).get("podSetUpdates") or []:
        node = (update.get("nodeSelector") or {}).get(HOSTNAME_LABEL)
        if isinstance(node, str) and node and isinstance(update.get("name"), str):
            out[update["name"]] = node
    return out


def pod_set_updates(pins: Pins) -> list[dict[str, Any]]:
    """The ``podSetUpdates`` of a Ready state for ``pins``, in a stable order (Kueue refuses to let
    a Ready state's updates change, so the same pins must always write the same list)."""
    return [{"name": group, "nodeSelector": {HOSTNAME_LABEL: node}} for group, node in sorted(pins.items())]


class HostnameLabels:
    """Whether a node's ``kubernetes.io/hostname`` label is its name, read once per node (the
    kubelet sets the label when it registers the node; it does not change while the node lives).
    A node that cannot be read is not pinned, and asked about again next time."""

    def __init__(self, api: client.ApiClient) -> None:
        self._core = client.CoreV1Api(api)
        self._known: dict[str, bool] = {}
        self._lock = threading.Lock()

    def names_itself(self, node: str) -> bool:
        with self._lock:
            known = self._known.get(node)
        if known is not None:
            return known
        try:
            metadata = self._core.read_node(node).metadata
        except ApiException as error:
            log.warning(
                "reading node %s failed (%s %s); its pods are not held to it",
                node,
                error.status,
                error.reason,
            )
            return False
        result = bool(metadata and (metadata.labels or {}).get(HOSTNAME_LABEL) == node)
        if not result:
            log.info(
                "node %s: its %s label is not its name; pods planned on it are not held to it",
                node,
                HOSTNAME_LABEL,
            )
        with self._lock:
            self._known[node] = result
        return result


def pins_for(
    workload: Mapping[str, Any], placements: Sequence[Placement], labels: HostnameLabels
) -> dict[str, str]:
    """The PodSets of a Workload just found to fit that can be held to their one planned node."""
    return {
        group: node
        for group, node in single_node_groups(placements).items()
        if not selects_hostname(workload, group) and labels.names_itself(node)
    }
