"""The seccomp profile of the containers whose GPU share the shim enforces: added, refused or warned
about, as the chart value ``webhook.seccomp`` says; pure.

The shim's limits hold while a container cannot change its own mounts. Under the ``Unconfined``
profile, which is what the kubelet gives a container that names none (unless it runs with
``--seccomp-default``), a tenant can ``unshare -Urm``: as root of a new user namespace it may mount
over ``/etc/ld.so.preload`` or ``/run/tessera`` and start programs without the shim or with limits of
its own. The runtime's default profile (``RuntimeDefault``) refuses ``unshare`` and ``clone`` of new
namespaces to a container without ``CAP_SYS_ADMIN``; a ``Localhost`` profile is one an administrator
put on the node, and is trusted the same way.

The modes:

- ``enforce`` (the default): a container with no profile, its own or the pod's, gets
  ``RuntimeDefault`` in its own ``securityContext`` (so other containers of the pod are unchanged,
  and HAMi's manifests, which never name one, keep working); one whose profile, its own or else the
  pod's, is anything else (``Unconfined``) is refused with one sentence.
- ``warn``: nothing changes; each such container gets a warning.
- ``off``: nothing.

Only CREATE is reviewed, so pods already running are never touched. Containers on MIG instances and
whole GPUs with enforcement off run without the shim, so there is nothing in them to lift: they are
left as they are.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from tessera.gpu_request import Refusal
from tessera.quantity import quote

ENFORCE = "enforce"
WARN = "warn"
OFF = "off"
MODES = (ENFORCE, WARN, OFF)

CHART_VALUE = "webhook.seccomp"
"""The chart value that sets the mode (the webhook's ``--seccomp``)."""

CONFINED = frozenset({"RuntimeDefault", "Localhost"})
"""Profiles under which a tenant cannot make the user namespace that would let it remount."""

ADDED = {"type": "RuntimeDefault"}


@dataclass(frozen=True)
class ShimContainer:
    """A container whose share the shim enforces, and where it sits in the pod."""

    list_name: str  # "containers" or "initContainers"
    index: int
    container: Mapping[str, Any]
    where: str
    """How messages name it: 'container "main"'."""


def _profile(holder: Mapping[str, Any]) -> Mapping[str, Any] | None:
    """``securityContext.seccompProfile`` of a pod spec or a container, None when absent."""
    security = holder.get("securityContext")
    profile = security.get("seccompProfile") if isinstance(security, Mapping) else None
    return profile if isinstance(profile, Mapping) else None


def effective(spec: Mapping[str, Any], container: Mapping[str, Any]) -> tuple[str | None, str]:
    """The profile type the container runs under and where it is set ("container" or "pod"): the
    container's own wins over the pod's, as in Kubernetes; (None, "") when neither sets one."""
    own = _profile(container)
    if own is not None:
        return own.get("type"), "container"
    pod = _profile(spec)
    if pod is not None:
        return pod.get("type"), "pod"
    return None, ""


def _add(item: ShimContainer) -> dict[str, Any]:
    """The JSONPatch operation that gives ``item`` ``RuntimeDefault`` in its own securityContext."""
    base = f"/spec/{item.list_name}/{item.index}/securityContext"
    if isinstance(item.container.get("securityContext"), Mapping):
        return {"op": "add", "path": f"{base}/seccompProfile", "value": dict(ADDED)}
    return {"op": "add", "path": base, "value": {"seccompProfile": dict(ADDED)}}


def review(
    spec: Mapping[str, Any], containers: list[ShimContainer], mode: str
) -> tuple[list[dict[str, Any]], list[str]]:
    """The patch operations and warnings that ``mode`` gives ``containers``; raises Refusal, in
    ``enforce``, for the first one with a profile other than ``RuntimeDefault`` or ``Localhost``."""
    operations: list[dict[str, Any]] = []
    warnings: list[str] = []
    system = spec.get("os")
    if mode == OFF or (isinstance(system, Mapping) and system.get("name") == "windows"):
        return operations, warnings  # a Windows pod may not name a seccomp profile at all
    for item in containers:
        kind, level = effective(spec, item.container)
        if kind in CONFINED:
            continue
        if mode == WARN:
            warnings.append(
                f"{item.where}: it runs without a RuntimeDefault or Localhost seccomp profile, so it "
                "could leave its GPU share's limits through a user namespace (unshare); set "
                "securityContext.seccompProfile.type RuntimeDefault."
            )
        elif kind is None:
            operations.append(_add(item))
        else:
            raise Refusal(
                f"{item.where}: seccomp profile {quote(kind)}, set on the {level}, would let it leave "
                "its GPU share's limits through a user namespace (unshare); ask RuntimeDefault or "
                f"Localhost, or ask an administrator about the chart value {CHART_VALUE}."
            )
    return operations, warnings
