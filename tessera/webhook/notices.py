"""Warnings for HAMi inputs Tessera reads but does not act on, or acts on differently: a
container's HAMi-core environment variables, a privileged GPU container (HAMi refuses it), the
pod's other ``hami.io/`` annotations and ``nvidia.com/priority`` written as an annotation; pure.

The shim reads none of HAMi-core's variables (its limits come from the claim, through files the
driver writes), so a variable a HAMi user sets to change a limit changes nothing, and the user is
told so at admission rather than finding out from the workload.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from tessera.gpu_request import GpuRequest, disable_control
from tessera.names import (
    HAMI_DISABLE_CONTROL,
    HAMI_GPU_POLICY,
    HAMI_NODE_POLICY,
    HAMI_PRIORITY,
    HAMI_SCORING_WEIGHTS,
)
from tessera.quantity import quote
from tessera.webhook.policies import MAX_WARNING

MAX_WARNINGS = 12
"""Warnings sent for one pod: the API server passes on at most 4 KiB of them in all."""

HAMI_PREFIX = "hami.io/"

_LIMITS_FROM_CLAIM = "is HAMi-core's and is ignored: limits come from nvidia.com/gpumem and gpucores"

IGNORED_ENV: Mapping[str, str] = {
    "CUDA_OVERSUBSCRIBE": "is ignored: the memory limit holds, and nothing spills to host memory",
    "CUDA_DEVICE_MEMORY_LIMIT": _LIMITS_FROM_CLAIM,
    "CUDA_DEVICE_SM_LIMIT": _LIMITS_FROM_CLAIM,
    "GPU_CORE_UTILIZATION_POLICY": "is ignored: a gpucores cap always holds, and no cap is set without one",
}
"""HAMi-core's variables a user may write, and what happens instead; ``CUDA_DEVICE_MEMORY_LIMIT_<n>``
(one GPU's limit) counts as ``CUDA_DEVICE_MEMORY_LIMIT``."""

READ_ANNOTATIONS = frozenset({HAMI_GPU_POLICY, HAMI_NODE_POLICY, HAMI_SCORING_WEIGHTS})


def _ignored(name: str) -> str | None:
    if name in IGNORED_ENV:
        return IGNORED_ENV[name]
    if name.startswith("CUDA_DEVICE_MEMORY_LIMIT_"):
        return IGNORED_ENV["CUDA_DEVICE_MEMORY_LIMIT"]
    return None


def env_warnings(where: str, container: Mapping[str, Any], share: GpuRequest | None) -> list[str]:
    """What the container's ``CUDA_DISABLE_CONTROL`` did to its ``share`` when that is not the
    obvious (a MIG container, ``share`` None, runs without the shim anyway), that a privileged
    container is not bound by its share, and each HAMi-core variable it sets, which the shim
    ignores."""
    warnings = []
    entry = disable_control(container) if share is not None else None
    value = (entry or {}).get("value")
    if share is not None and not share.enforce:
        warnings.append(
            f"{where}: {HAMI_DISABLE_CONTROL}=true gives it a whole GPU without limits (all memory "
            "and cores), as HAMi's opt-out does."
        )
    elif entry is not None and not isinstance(value, str) and entry.get("valueFrom") is not None:
        warnings.append(
            f"{where}: {HAMI_DISABLE_CONTROL} comes from valueFrom, unknown at admission, so limits stay on."
        )
    elif isinstance(value, str) and value.lower() not in ("false", ""):
        warnings.append(
            f"{where}: {HAMI_DISABLE_CONTROL} is {quote(value)}; only "
            '"true" turns limits off, so they stay on.'
        )
    security = container.get("securityContext")
    if isinstance(security, Mapping) and security.get("privileged") is True:
        warnings.append(
            f"{where}: it is privileged, so it sees every GPU of its node and no share's limits bind "
            "it; HAMi refuses such containers (docs/threat-model.md)."
        )
    env = container.get("env")
    names = [e.get("name") for e in env if isinstance(e, Mapping)] if isinstance(env, list) else []
    for name in dict.fromkeys(n for n in names if isinstance(n, str)):
        reason = _ignored(name)
        if reason:
            warnings.append(f"{where}: environment variable {name} {reason}.")
    return warnings


def annotation_warnings(annotations: Mapping[str, str]) -> list[str]:
    """One warning per ``hami.io/`` annotation Tessera does not read (HAMi's scheduler writes most
    of them, on its own pods): nothing here acts on it. And one for ``nvidia.com/priority`` as an
    annotation, which users write expecting it to act as the resource of that name does."""
    warnings = [
        f"annotation {quote(key)} is HAMi's and Tessera does not read it; it changes nothing."
        for key in annotations
        if key.startswith(HAMI_PREFIX) and key not in READ_ANNOTATIONS
    ]
    if HAMI_PRIORITY in annotations:
        warnings.append(
            f"annotation {HAMI_PRIORITY} is not read; the container resource {HAMI_PRIORITY} (in "
            "resources.limits, 0 high or 1 low) is the one honoured."
        )
    return warnings


def bounded(warnings: list[str]) -> list[str]:
    """At most :data:`MAX_WARNINGS` warnings of at most ``MAX_WARNING`` characters each, the last
    one saying how many were left out."""
    out = [warning[:MAX_WARNING] for warning in warnings]
    if len(out) > MAX_WARNINGS:
        out = [*out[: MAX_WARNINGS - 1], f"{len(out) - MAX_WARNINGS + 1} more warnings were left out."]
    return out
