"""Kubernetes client set-up shared by every Tessera component and the tests.

One place decides how a client is built (an explicit kubeconfig, else $KUBECONFIG, else the
in-cluster service account), so the driver, the webhook and the tests cannot drift apart.
"""

from __future__ import annotations

import os
from pathlib import Path

from kubernetes import client, config


def api_client(kubeconfig: Path | None = None) -> client.ApiClient:
    """An ApiClient for the given kubeconfig, $KUBECONFIG, or the pod's service account, in that order."""
    path = kubeconfig or (Path(os.environ["KUBECONFIG"]) if os.environ.get("KUBECONFIG") else None)
    if path is not None:
        api: client.ApiClient = config.new_client_from_config(config_file=str(path))  # type: ignore[no-untyped-call]
        return api
    configuration = client.Configuration()
    config.load_incluster_config(client_configuration=configuration)  # type: ignore[no-untyped-call]
    return client.ApiClient(configuration)
