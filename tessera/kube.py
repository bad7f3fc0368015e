"""Kubernetes client set-up shared by every Tessera component and the tests.

One place decides how a client is built (an explicit kubeconfig, else $KUBECONFIG, else the
in-cluster service account), so the driver, the webhook and the tests cannot drift apart.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

from kubernetes import client, config
from kubernetes.client import ApiException


def api_client(kubeconfig: Path | None = None) -> client.ApiClient:
    """An ApiClient for the given kubeconfig, $KUBECONFIG, or the pod's service account, in that order.

    $KUBECONFIG may list several files (a:b), as kubectl allows; the client merges them."""
    path = str(kubeconfig) if kubeconfig else os.environ.get("KUBECONFIG")
    if path:
        api: client.ApiClient = config.new_client_from_config(config_file=path)  # type: ignore[no-untyped-call]
        return api
    if not os.environ.get("KUBERNETES_SERVICE_HOST"):
        raise RuntimeError("no Kubernetes credentials: pass a kubeconfig, set KUBECONFIG, or run in a pod")
    configuration = client.Configuration()
    config.load_incluster_config(client_configuration=configuration)  # type: ignore[no-untyped-call]
    return client.ApiClient(configuration)


def raw_json(response: Any) -> dict[str, Any]:
    """The JSON body of a call made with ``_preload_content=False``.

    The driver reads claims and slices as plain JSON: the client's typed models cost milliseconds
    per object to build, which a prepare call answering within the kubelet's budget cannot spend."""
    body: dict[str, Any] = json.loads(response.data)
    return body


def create_if_absent(create: Callable[..., Any], *args: Any, **kwargs: Any) -> bool:
    """Call a client ``create_*`` method; an object that already exists (409 AlreadyExists) is
    success, as for every idempotent writer here. Returns whether this call created it."""
    try:
        create(*args, **kwargs)
    except ApiException as error:
        if error.status != 409:
            raise
        return False
    return True
