"""Shared helpers of the webhook tests: pods, reviews, a fleet, and an RFC 6902 patch applier for the
two operations the webhook emits (so a test can check the patched pod, not the patch's wording)."""

from __future__ import annotations

import base64
import copy
import json
from typing import Any

from hypothesis import strategies as st

from tessera.names import HAMI_RESOURCES, HAMI_USE_TYPE
from tessera.quantity import GiB
from tessera.webhook.fleet import Fleet

FLEET = Fleet(memory_sizes=(80 * GiB, 40 * GiB), max_gpus_per_node=4)


def container(name: str = "main", limits: dict[str, Any] | None = None, **extra: Any) -> dict[str, Any]:
    body: dict[str, Any] = {"name": name, "image": "busybox"}
    if limits is not None:
        body["resources"] = {"limits": dict(limits)}
    body.update(extra)
    return body


def pod(*containers: dict[str, Any], init: list[dict[str, Any]] | None = None, **meta: Any) -> dict[str, Any]:
    spec: dict[str, Any] = {"containers": list(containers) or [container()]}
    if init:
        spec["initContainers"] = init
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"namespace": "team", **meta}, "spec": spec}


def request(obj: dict[str, Any], operation: str = "CREATE", dry_run: bool = False) -> dict[str, Any]:
    return {
        "uid": "0d9b7c3e-1f00-4a4e-9b1a-5d7c2f3e4a11",
        "kind": {"group": "", "version": "v1", "kind": "Pod"},
        "operation": operation,
        "namespace": "team",
        "object": obj,
        "dryRun": dry_run,
    }


def _unescape(token: str) -> str:
    return token.replace("~1", "/").replace("~0", "~")


def apply_patch(document: dict[str, Any], operations: list[dict[str, Any]]) -> dict[str, Any]:
    """``document`` with ``operations`` (add/remove) applied strictly: a missing parent, a missing
    member to remove or an existing member to add raises, as a real JSONPatch implementation would."""
    result = copy.deepcopy(document)
    for operation in operations:
        *parents, last = [_unescape(token) for token in operation["path"].split("/")[1:]]
        target: Any = result
        for token in parents:
            target = target[int(token)] if isinstance(target, list) else target[token]
        if operation["op"] == "add":
            if isinstance(target, list):
                if last == "-":
                    target.append(operation["value"])
                else:
                    target.insert(int(last), operation["value"])
            else:
                target[last] = operation["value"]
        elif operation["op"] == "remove":
            if isinstance(target, list):
                del target[int(last)]
            else:
                del target[last]  # KeyError when absent: the apiserver would refuse the patch too
        else:
            raise AssertionError(f"unexpected operation {operation['op']}")
    return result


def decoded_patch(review: Any) -> list[dict[str, Any]]:
    response = review["response"]
    assert response["patchType"] == "JSONPatch"
    operations: list[dict[str, Any]] = json.loads(base64.b64decode(response["patch"]))
    return operations


_values = st.one_of(
    st.integers(min_value=-3, max_value=200),
    st.sampled_from(["1", "0", "1.5", "8000", "80Gi", "x", "100", "-1", "1k", "500m", ""]),
)
_resources = st.dictionaries(st.sampled_from([*HAMI_RESOURCES, "cpu", "memory"]), _values, max_size=4)
_hami_resources = st.dictionaries(st.sampled_from(HAMI_RESOURCES), _values, max_size=4)


@st.composite
def _containers(draw: st.DrawFn, prefix: str, hami_only: bool) -> list[dict[str, Any]]:
    resource_maps = _hami_resources if hami_only else _resources
    count = draw(st.integers(min_value=0, max_value=3))
    made = []
    for index in range(count):
        body: dict[str, Any] = {"name": f"{prefix}{index}", "image": "busybox"}
        sections = draw(st.sampled_from(["none", "limits", "requests", "both", "same"]))
        resources: dict[str, Any] = {}
        if sections in ("limits", "both", "same"):
            resources["limits"] = draw(resource_maps)
        if sections in ("requests", "both"):
            resources["requests"] = draw(resource_maps)
        if sections == "same":
            resources["requests"] = dict(resources["limits"])
        if draw(st.booleans()):
            resources["claims"] = [{"name": "existing"}]
        if sections != "none" or resources:
            body["resources"] = resources
        if prefix == "init" and draw(st.booleans()):
            body["restartPolicy"] = "Always"
        made.append(body)
    return made


@st.composite
def random_pods(draw: st.DrawFn, hami_only: bool = False) -> dict[str, Any]:
    """Pods with 0-3 containers and init containers asking random (often invalid) HAMi values in
    limits, requests or both, random annotation text and sometimes claims of their own; with
    ``hami_only`` every other field is valid, so the apiserver judges only what the webhook did."""
    obj = pod(
        *draw(_containers("c", hami_only)) or [container("main")],
        init=draw(_containers("init", hami_only)) or None,
    )
    annotations = draw(
        st.dictionaries(
            st.sampled_from(
                [
                    "nvidia.com/use-gpuuuid",
                    "nvidia.com/nouse-gpuuuid",
                    HAMI_USE_TYPE,
                    "nvidia.com/nouse-gputype",
                ]
            ),
            st.text(max_size=20),
            max_size=2,
        )
    )
    if annotations:
        obj["metadata"]["annotations"] = annotations
    referenced = any(
        "claims" in (c.get("resources") or {})
        for c in obj["spec"]["containers"] + obj["spec"].get("initContainers", [])
    )
    if referenced if hami_only else draw(st.booleans()):
        obj["spec"]["resourceClaims"] = [{"name": "existing", "resourceClaimName": "shared"}]
    return obj
