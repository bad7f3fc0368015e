"""GPU pods created one after another while something happens to the release (an upgrade, a webhook
pod deleted), to show that the API server kept calling a webhook that converted each of them.

"Refused" is what failurePolicy Fail makes of a webhook the API server cannot call or does not trust:
the create fails with ``failed calling webhook``. Every create, dry run or not, is one real call to
the webhook through the API server.
"""

from __future__ import annotations

import threading
from typing import Any

import yaml
from kubernetes import client

from testbed.helm import REPO

HAMI_POD = REPO / "examples" / "hami-pod.yaml"


def hami_pod(name: str) -> client.V1Pod:
    """The HAMi example pod (2000 MiB, 25 % of one GPU), named ``name``."""
    body: dict[str, Any] = yaml.safe_load(HAMI_POD.read_text())
    body["metadata"]["name"] = name
    for container in body["spec"]["containers"]:  # YAML reads the quantities as numbers
        limits = container["resources"]["limits"]
        limits.update({key: str(value) for key, value in limits.items()})
    return client.V1Pod.model_validate(body)


class PodStream:
    """Creates a HAMi pod every ``every`` seconds until stopped, from a thread of its own; keeps the
    names created, the ones the webhook did not convert (no claim in the answer), and every refusal
    the API answered. With ``dry_run`` nothing is stored, so the stream may be fast."""

    def __init__(self, kube: client.ApiClient, namespace: str, every: float, dry_run: bool = False) -> None:
        self._core = client.CoreV1Api(kube)
        self._namespace = namespace
        self._every = every
        self._dry_run = dry_run
        self._stop = threading.Event()
        self.created: list[str] = []
        self.unconverted: list[str] = []
        self.refused: list[str] = []
        self._thread = threading.Thread(target=self._run, name="pod-stream", daemon=True)

    @property
    def calls(self) -> int:
        """Creates answered so far, either way."""
        return len(self.created) + len(self.refused)

    def __enter__(self) -> PodStream:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(30)

    def _run(self) -> None:
        while not self._stop.is_set():
            name = f"stream-{self.calls}"
            try:
                answer = self._core.create_namespaced_pod(
                    self._namespace, hami_pod(name), dry_run="All" if self._dry_run else None
                )
                self.created.append(name)
                if not (answer.spec is not None and answer.spec.resource_claims):
                    self.unconverted.append(name)
            except client.ApiException as error:
                self.refused.append(f"{name}: {error.status} {error.body}")
            self._stop.wait(self._every)
