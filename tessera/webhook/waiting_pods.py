"""Why a GPU pod waits, told on the pod: an Event with ``kubectl tessera why``'s reasons on each pod
with Tessera claims that the scheduler has called unschedulable for a while, written again only
when the reasons change, so that ``kubectl describe pod`` says more than "cannot allocate all
claims".

The judgement is ``tessera.kubectl.why.judge``, the plugin's own, so the Event and the plugin never
disagree. Every webhook replica runs this loop, and none is elected: an Event's name is made from
the pod's UID and its message, so a second replica's create of the same Event is refused (409)
and nothing is written twice, and each replica remembers what it last told each pod, so while the
reasons stand it writes nothing at all. When they change back to an earlier message, that Event's
``lastTimestamp`` is moved to now (the way the kubelet repeats an Event), so it shows as the latest.

Work per period is bounded: one list of the pods no node is chosen for, and only when one of them
has waited long enough, one read of the cluster's GPUs (slices, taint rules, nodes, claims,
templates) shared by at most ``MAX_PODS`` judgements.
"""

from __future__ import annotations

import datetime
import hashlib
import logging
import threading
from collections.abc import Callable, Mapping
from typing import Any

from kubernetes import client
from kubernetes.client import ApiException

from tessera.kubectl import snapshot, why
from tessera.kubectl.text import clean, cut

log = logging.getLogger(__name__)

REASON = "WaitingForGPUShare"
COMPONENT = "tessera-webhook"
MAX_PODS = 200
"""Pods judged in one look; past that, those not yet told go first (``in_turn``), and the rest
wait for a later look."""
MESSAGE_LIMIT = 1024
"""Characters of an Event's message (events.k8s.io caps a note at 1 kB)."""
_POD_NAME_LIMIT = 200
"""Characters of the pod's name in an Event's name (253 at most, with the digest after it)."""

Obj = dict[str, Any]


def message_of(verdict: why.Verdict) -> str:
    """The Event's message: the plugin's reasons, in its order, within ``MESSAGE_LIMIT``. The reasons
    quote what the pod's author wrote (a GPU type, a UUID), and ``kubectl describe`` prints an
    Event as it is: control and invisible characters are escaped as the plugin escapes them, so
    no pod can send escape sequences or reordering marks to an operator's terminal."""
    text = "waits for a GPU share: " + "; ".join(verdict.reasons)
    return cut(clean(text, limit=MESSAGE_LIMIT), MESSAGE_LIMIT - 32)


def event_name(pod: Mapping[str, Any], message: str) -> str:
    """The same name for the same pod and message, whichever replica writes it."""
    metadata = pod["metadata"]
    digest = hashlib.sha256(f"{metadata['uid']}\n{message}".encode()).hexdigest()[:16]
    return f"{metadata['name'][:_POD_NAME_LIMIT]}.tessera-{digest}"


def in_turn(due: list[Obj], told: Mapping[str, str]) -> list[Obj]:
    """``due`` with the pods not told anything yet first, each group in its own order: with more
    waiting pods than one look judges, every pod is told in time, not the same first ones."""
    return sorted(due, key=lambda pod: pod["metadata"]["uid"] in told)


class WaitingPods:
    """Judges the pods that wait, every ``period`` seconds, and tells each why (the module says how)."""

    def __init__(
        self,
        api: client.ApiClient,
        after: float,
        period: float,
        instance: str,
        clock: Callable[[], datetime.datetime] = lambda: datetime.datetime.now(datetime.UTC),
    ) -> None:
        self._api = api
        self._core = client.CoreV1Api(api)
        self._after = datetime.timedelta(seconds=after)
        self._period = period
        self._instance = instance
        self._clock = clock
        self._told: dict[str, str] = {}
        """Pod UID -> the message this replica last wrote or found written; only pods still waiting."""

    def run(self, stop: threading.Event) -> None:
        """Sweep every period until ``stop``; a failed sweep is logged and the next one tried."""
        while not stop.wait(self._period):
            try:
                self.sweep()
            except Exception as error:  # the API server away, or an answer not understood
                log.warning("could not tell waiting GPU pods why they wait: %s", error)

    def sweep(self) -> int:
        """One period's work; returns how many Events were written or moved."""
        pods = snapshot.listed(
            "pods", self._core.list_pod_for_all_namespaces, [], field_selector="spec.nodeName="
        )
        now = self._clock()
        due = []
        for pod in pods:
            since = why.waiting_since(pod)
            if (
                since is not None
                and now - since >= self._after
                and (pod.get("spec") or {}).get("resourceClaims")
            ):
                due.append(pod)
        waiting = {pod["metadata"]["uid"] for pod in due}
        self._told = {uid: told for uid, told in self._told.items() if uid in waiting}
        if not due:
            return 0
        found = snapshot.read(self._api, None, frozenset({"slices", "templates"}))
        written = 0
        for pod in in_turn(due, self._told)[:MAX_PODS]:
            verdict = why.judge(pod, found)
            if verdict.fits:  # no Tessera share, or shares that fit: a GPU is not what it waits for
                continue
            message = message_of(verdict)
            uid = pod["metadata"]["uid"]
            if self._told.get(uid) == message:
                continue
            try:
                written += self._tell(pod, message, back_to=uid in self._told)
            except ApiException as error:  # e.g. its namespace is being deleted: the others still
                log.warning(
                    "could not tell pod %s/%s why it waits: %s %s",
                    pod["metadata"]["namespace"],
                    pod["metadata"]["name"],
                    error.status,
                    error.reason,
                )
                continue
            self._told[uid] = message
        return written

    def _tell(self, pod: Obj, message: str, back_to: bool) -> int:
        """Write the pod's Event (1), or find it written (0); with ``back_to`` (this replica told
        the pod something else since), an Event already there is moved to now (1)."""
        namespace, name = pod["metadata"]["namespace"], event_name(pod, message)
        now = self._clock()
        try:
            self._core.create_namespaced_event(namespace, self._body(pod, name, message, now))
            log.info("told pod %s/%s: %s", namespace, pod["metadata"]["name"], message)
            return 1
        except ApiException as error:
            if error.status != 409:
                raise
        if not back_to:
            return 0  # another replica wrote it, or this one before a restart
        self._core.patch_namespaced_event(name, namespace, {"lastTimestamp": now.isoformat()})
        return 1

    def _body(self, pod: Obj, name: str, message: str, now: datetime.datetime) -> client.CoreV1Event:
        metadata = pod["metadata"]
        return client.CoreV1Event.model_validate(
            {
                "metadata": {"name": name, "namespace": metadata["namespace"]},
                "involvedObject": {
                    "apiVersion": "v1",
                    "kind": "Pod",
                    "namespace": metadata["namespace"],
                    "name": metadata["name"],
                    "uid": metadata["uid"],
                },
                "type": "Warning",
                "reason": REASON,
                "message": message,
                "source": {"component": COMPONENT},
                "reportingComponent": COMPONENT,
                "reportingInstance": self._instance,
                "firstTimestamp": now,
                "lastTimestamp": now,
                "count": 1,
            }
        )
