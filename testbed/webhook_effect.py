"""When a newly registered Tessera webhook takes effect: the API server loads webhook configurations
asynchronously, so a pod created right after registration may not be sent to the webhook at all."""

from __future__ import annotations

from kubernetes import client
from kubernetes.client import ApiException

from testbed.polling import poll_until

_PROBE = {
    "metadata": {"name": "probe"},
    "spec": {
        "containers": [{"name": "c", "image": "x", "resources": {"limits": {"nvidia.com/gpucores": "101"}}}]
    },
}


def wait_until_webhook_answers(kube: client.ApiClient, namespace: str, timeout: float = 60) -> None:
    """Wait until a dry-run pod in ``namespace`` asking 101 % of a GPU's cores is denied by the
    webhook, which only the webhook does."""
    core = client.CoreV1Api(kube)

    def denied() -> bool:
        try:
            core.create_namespaced_pod(namespace, client.V1Pod.model_validate(_PROBE), dry_run="All")
        except ApiException as error:
            return "nvidia.com/gpucores is 101" in str(error.body)
        return False

    poll_until(denied, timeout, "the apiserver calling the webhook")
