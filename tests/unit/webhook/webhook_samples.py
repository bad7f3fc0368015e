"""Shared helpers of the webhook tests: pods, reviews, a fleet, and an RFC 6902 patch applier for the
two operations the webhook emits (so a test can check the patched pod, not the patch's wording)."""

from __future__ import annotations

import base64
import copy
import json
from typing import Any

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


def decoded_patch(review: dict[str, Any]) -> list[dict[str, Any]]:
    response = review["response"]
    assert response["patchType"] == "JSONPatch"
    operations: list[dict[str, Any]] = json.loads(base64.b64decode(response["patch"]))
    return operations
