"""The HAMi example pod, created one after another while something happens to the release (an upgrade,
a webhook pod deleted, the API server gone), to show that the API server kept calling a webhook that
converted each of them, and that each runs with its share.

"Refused" is what failurePolicy Fail makes of a webhook the API server cannot call or does not trust:
the create fails with ``failed calling webhook``. Every create, dry run or not, is one real call to
the webhook through the API server.
"""

from __future__ import annotations

import functools
import json
import threading
import time
from typing import Any, cast

import yaml
from kubernetes import client

from tessera.kube import raw_json
from testbed.chart_bed import EXAMPLE_SHARES, EXAMPLES, scrape
from testbed.pod_state import events
from testbed.polling import Fatal

HAMI_POD = EXAMPLES / "hami-pod.yaml"
HAMI_SHARE = EXAMPLE_SHARES[HAMI_POD.name]
_CALL_TIMEOUT = 30.0
"""Seconds one create may take: the API server waits at most the webhook's timeoutSeconds (5) for it."""


@functools.cache
def _hami_pod_text() -> str:
    body: dict[str, Any] = yaml.safe_load(HAMI_POD.read_text())
    for container in body["spec"]["containers"]:  # YAML reads the quantities as numbers
        limits = container["resources"]["limits"]
        limits.update({key: str(value) for key, value in limits.items()})
    return json.dumps(body)


def hami_pod_body(name: str) -> dict[str, Any]:
    """The HAMi example pod (2000 MiB, 25 % of one GPU), named ``name``, as plain JSON: what a stream
    of creates sends, without the client's typed model (milliseconds of the test's CPU per pod)."""
    body: dict[str, Any] = json.loads(_hami_pod_text())
    body["metadata"]["name"] = name
    return body


def hami_pod(name: str) -> client.V1Pod:
    """The HAMi example pod (2000 MiB, 25 % of one GPU), named ``name``."""
    return client.V1Pod.model_validate(hami_pod_body(name))


def running_with_its_share(kube: client.ApiClient, namespace: str, name: str) -> bool:
    """Whether the HAMi pod ``name`` runs and has printed the limits of its share (its limits file);
    Fatal, which ends a poll at once, if it failed or printed other limits."""
    core = client.CoreV1Api(kube)
    pod = core.read_namespaced_pod(name, namespace)
    assert pod.status is not None
    if pod.status.phase == "Failed":
        raise Fatal(f"{namespace}/{name} failed:\n{events(kube, namespace)}")
    if pod.status.phase != "Running":
        return False
    log = str(core.read_namespaced_pod_log(name, namespace))
    if f"memory={HAMI_SHARE.memory} cores={HAMI_SHARE.cores}" in log:
        return True
    if "memory=" in log:
        raise Fatal(f"{namespace}/{name} runs with limits other than its share:\n{log}")
    return False  # not printed yet


def in_metrics(address: str, pod: str) -> bool:
    """Whether the exporter on the node at ``address`` has series of ``pod``."""
    return f'pod="{pod}"' in scrape(address)


class PodStream:
    """Creates a HAMi pod every ``every`` seconds until stopped, from a thread of its own; keeps the
    names created, the ones the webhook did not convert (no claim in the answer), and every refusal
    the API answered. With ``dry_run`` nothing is stored, so the stream may be fast. A create that
    fails otherwise (the API server unreachable) ends the stream, and leaving the ``with`` raises it."""

    def __init__(
        self,
        kube: client.ApiClient,
        namespace: str,
        every: float,
        dry_run: bool = False,
        limit: int | None = None,
    ) -> None:
        self._core = client.CoreV1Api(kube)
        self._namespace = namespace
        self._every = every
        self._dry_run = dry_run
        # At most this many pods: as many as the GPUs have room for, when each of them must run.
        self._limit = limit
        self._stop = threading.Event()
        self.created: list[str] = []
        self.unconverted: list[str] = []
        self.refused: list[str] = []
        self._failure: Exception | None = None
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
        self._thread.join(_CALL_TIMEOUT + 5)
        if self._thread.is_alive():
            raise RuntimeError("the pod stream did not stop: a create hangs")
        if self._failure is not None:
            raise RuntimeError(f"the pod stream stopped after {self.calls} creates") from self._failure

    def _run(self) -> None:
        # Paced by due times, so the answer's latency does not slow the stream below one create per
        # ``every`` (a create due while the last is in flight goes as soon as it is answered), and
        # never faster: a stall is not made up for with a burst.
        due = time.monotonic()
        while not self._stop.is_set() and (self._limit is None or len(self.created) < self._limit):
            name = f"stream-{self.calls}"
            try:
                answer = raw_json(
                    self._core.create_namespaced_pod(
                        self._namespace,
                        # The client sends a dict body as it is; its model would cost the CPU saved.
                        cast(client.V1Pod, hami_pod_body(name)),
                        dry_run="All" if self._dry_run else None,
                        _request_timeout=_CALL_TIMEOUT,
                        _preload_content=False,
                    )
                )
                self.created.append(name)
                if not (answer.get("spec") or {}).get("resourceClaims"):
                    self.unconverted.append(name)
            except client.ApiException as error:
                self.refused.append(f"{name}: {error.status} {error.body}")
            except Exception as error:  # not an answer: the stream cannot say what the webhook did
                self._failure = error
                return
            due = max(due + self._every, time.monotonic())
            self._stop.wait(due - time.monotonic())
