"""Events on a pod, written off the caller's thread: what the bypass loop did and why, where
``kubectl describe pod`` shows it.

The loop must keep its period whatever the API server does, so an Event is queued and written by
a thread of its own; one that cannot be written is logged (the loop's own log line already says
the same) and dropped. Core v1 Events, as the kubelet writes them, each a new object
(``generateName``): an episode is written once, never updated. The exporter's account may create
Events and nothing else about them (charts/tessera/files/kubeletplugin-rules.yaml).
"""

from __future__ import annotations

import datetime
import logging
import queue
import threading
from collections.abc import Callable
from typing import Any

from kubernetes import client

from tessera.exporter.reading import Placed

log = logging.getLogger(__name__)

COMPONENT = "tessera-exporter"
_QUEUE_MAX = 256
"""Events waiting to be written; past that (an API server down for long), newer ones are dropped
and logged."""


class PodEvents:
    """``emit`` queues an Event on a pod; ``run`` writes them until ``stop`` is set."""

    def __init__(self, create: Callable[..., Any], node: str) -> None:
        self._create = create
        self._node = node
        self._queue: queue.Queue[tuple[Placed, str, str, str]] = queue.Queue(_QUEUE_MAX)

    def emit(self, placed: Placed, type_: str, reason: str, message: str) -> None:
        try:
            self._queue.put_nowait((placed, type_, reason, message))
        except queue.Full:
            log.warning("dropping Event %s on pod %s/%s: too many waiting", reason, *_pod(placed))

    def run(self, stop: threading.Event) -> None:
        while not stop.is_set():
            try:
                placed, type_, reason, message = self._queue.get(timeout=0.5)
            except queue.Empty:
                continue
            try:
                self._create(placed.ref.namespace, self.body(placed, type_, reason, message))
            except Exception as error:  # the API server's answer, or none: logged, never fatal
                log.warning("could not write Event %s on pod %s/%s: %s", reason, *_pod(placed), error)

    def body(self, placed: Placed, type_: str, reason: str, message: str) -> client.CoreV1Event:
        now = datetime.datetime.now(datetime.UTC)
        ref = placed.ref
        return client.CoreV1Event.model_validate(
            {
                "metadata": {"generateName": f"{ref.pod}.", "namespace": ref.namespace},
                "involvedObject": {
                    "apiVersion": "v1",
                    "kind": "Pod",
                    "namespace": ref.namespace,
                    "name": ref.pod,
                    "uid": placed.pod_uid,
                },
                "type": type_,
                "reason": reason,
                "message": message,
                "source": {"component": COMPONENT, "host": self._node},
                "reportingComponent": COMPONENT,
                "reportingInstance": self._node,
                "firstTimestamp": now,
                "lastTimestamp": now,
                "count": 1,
            }
        )


def _pod(placed: Placed) -> tuple[str, str]:
    return placed.ref.namespace, placed.ref.pod
