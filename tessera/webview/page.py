"""What the web view's page shows, as plain data from one snapshot; pure.

The same rows ``kubectl tessera gpus`` prints (tessera/kubectl/views.py) and the same judgement
``kubectl tessera why`` and the webhook's Events give (tessera/kubectl/why.py), so the page, the
plugin and ``kubectl describe pod`` never disagree. Every string that came from the cluster is
anyone's input (a pod's name, a GPU type in an annotation) and passes through
:func:`tessera.kubectl.text.clean` here: one line of visible characters, bounded in length. The
template's autoescaping then takes care of markup; neither alone would do, as a control character
or 10 KiB is not markup.
"""

from __future__ import annotations

import datetime
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from tessera.kubectl import views, why
from tessera.kubectl.snapshot import Snapshot
from tessera.kubectl.text import clean

MAX_WAITING = 200
"""Waiting pods judged for one page, oldest first (as many as the webhook judges in one look); the
page says how many more wait."""

REASON_LIMIT = 400
"""Characters of one reason on the page."""

Point = tuple[float, float]
"""(seconds since the epoch, value)."""


@dataclass(frozen=True)
class ShareView:
    namespace: str
    pod: str
    claim: str
    memory: int
    cores: int
    usage: Sequence[Point] = ()
    """Memory in use over the last hour, when a Prometheus is configured and has it."""

    def memory_percent(self, capacity: int) -> float:
        return 100.0 * self.memory / capacity if capacity else 0.0


@dataclass(frozen=True)
class GpuView:
    node: str
    device: str
    uuid: str
    product: str
    memory_capacity: int
    memory_allocated: int
    cores_capacity: int
    cores_allocated: int
    taints: Sequence[str]
    cordoned: bool
    node_cordoned: bool
    shares: Sequence[ShareView]


@dataclass(frozen=True)
class MigView:
    node: str
    device: str
    profile: str
    parent: str
    memory: int | None
    claim: str
    pod: str


@dataclass(frozen=True)
class WaitingView:
    namespace: str
    pod: str
    since: str
    reasons: Sequence[str]


@dataclass(frozen=True)
class Page:
    gpus: Sequence[GpuView]
    migs: Sequence[MigView]
    waiting: Sequence[WaitingView]
    waiting_untold: int
    """Waiting pods past :data:`MAX_WAITING`, not judged for this page."""
    missing: Sequence[str]
    """Kinds the view's account could not read (forbidden, or not served)."""
    taken_at: str
    usage_note: str = ""
    """Why there is no usage history ('' when there is)."""


UsageHistory = Mapping[tuple[str, str], Sequence[Point]]
"""(namespace, pod) -> memory in use over time."""


def build(
    found: Snapshot,
    history: UsageHistory,
    now: datetime.datetime,
    usage_note: str = "",
) -> Page:
    """The page of the moment ``found`` was read, with ``history`` (empty when none is configured
    or Prometheus did not answer: ``usage_note`` says which)."""
    gpus = [_gpu(row, history) for row in views.gpu_rows(found)]
    migs = [
        MigView(
            node=clean(row["node"]),
            device=clean(row["device"]),
            profile=clean(row["profile"]),
            parent=clean(row["parent"]),
            memory=row["memory"],
            claim=clean(row["claim"]),
            pod=clean(row["pod"]),
        )
        for row in views.mig_rows(found)
    ]
    waiting, untold = _waiting(found, now)
    return Page(
        gpus=gpus,
        migs=migs,
        waiting=waiting,
        waiting_untold=untold,
        missing=[clean(kind) for kind in found.missing],
        taken_at=now.strftime("%Y-%m-%d %H:%M:%S UTC"),
        usage_note=usage_note,
    )


def _gpu(row: Mapping[str, Any], history: UsageHistory) -> GpuView:
    return GpuView(
        node=clean(row["node"]),
        device=clean(row["device"]),
        uuid=clean(row["uuid"]),
        product=clean(row["product"]),
        memory_capacity=int(row["memory"]["capacity"] or 0),
        memory_allocated=int(row["memory"]["allocated"] or 0),
        cores_capacity=int(row["cores"]["capacity"] or 0),
        cores_allocated=int(row["cores"]["allocated"] or 0),
        taints=[clean(taint) for taint in row["taints"]],
        cordoned=bool(row["cordoned"]),
        node_cordoned=bool(row["nodeCordoned"]),
        shares=[
            ShareView(
                namespace=clean(share["namespace"]),
                pod=clean(share["pod"]),
                claim=clean(share["claim"]),
                memory=int(share["memory"] or 0),
                cores=int(share["cores"] or 0),
                usage=history.get((share["namespace"], share["pod"]), ()),
            )
            for share in row["shares"]
        ],
    )


def _waiting(found: Snapshot, now: datetime.datetime) -> tuple[list[WaitingView], int]:
    """Pods with claims the scheduler found unschedulable, oldest first, judged; those whose shares
    fit now (they wait for something else) are left out."""
    waiting = []
    for pod in found.pods:
        since = why.waiting_since(pod)
        if since is not None and (pod.get("spec") or {}).get("resourceClaims"):
            waiting.append((since, pod))
    waiting.sort(key=lambda entry: entry[0])
    shown = []
    for since, pod in waiting[:MAX_WAITING]:
        verdict = why.judge(pod, found)
        if verdict.fits:
            continue
        metadata = pod.get("metadata") or {}
        shown.append(
            WaitingView(
                namespace=clean(metadata.get("namespace", "")),
                pod=clean(metadata.get("name", "")),
                since=_waited(now - since),
                reasons=[clean(reason, REASON_LIMIT) for reason in verdict.reasons],
            )
        )
    return shown, max(0, len(waiting) - MAX_WAITING)


def _waited(span: datetime.timedelta) -> str:
    seconds = max(0, int(span.total_seconds()))
    if seconds < 120:
        return f"{seconds} s"
    if seconds < 7200:
        return f"{seconds // 60} min"
    return f"{seconds // 3600} h"
