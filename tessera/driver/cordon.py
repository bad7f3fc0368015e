"""HAMi's node annotation ``hami.io/device-cordon: <uuid,...>``: the GPUs it lists take no new share.

The daemon watches its own Node; each GPU of this node the annotation names gets a NoSchedule taint
under :data:`~tessera.names.CORDONED_TAINT` in the node's ResourceSlice (the same way a lost GPU is
tainted), and the taint goes when the annotation stops naming it. Shares already allocated there keep
running: NoSchedule only keeps the scheduler from allocating new ones.

Why a taint in our own slice rather than a DeviceTaintRule (the native object an operator writes,
docs/driver.md "Cordoning a GPU"): a rule selects one device by name and is cluster-scoped, so the
daemon would need to create, update and delete DeviceTaintRules — rules that may taint any device of
any driver with NoExecute, evicting pods cluster-wide, which no RBAC rule can narrow to one node's
GPUs. The slice is already the daemon's to write (and the chart's admission policy limits it to the
daemon's own node); the cordon taint then changes with the rest of the slice in one write, with the
pool generation bumped, and goes with the slice.

The annotation is parsed with the same rules as a pod's ``nvidia.com/use-gpuuuid`` (bounded length,
comma-separated GPU UUIDs): a value that breaks them cordons nothing and is logged with one
sentence; a UUID that is not a GPU of this node is logged too. Both go to the daemon's log, not to
an Event: the daemon holds no permission to write Events, and a typo in a node annotation is not
worth granting one.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Collection, Mapping
from typing import Any

from kubernetes import client

from tessera.driver.device_health import _now
from tessera.driver.devices import DeviceTaint
from tessera.gpu_request import AnnotationError, uuid_entries
from tessera.names import CORDONED_TAINT, HAMI_DEVICE_CORDON
from tessera.watching import watch_forever

log = logging.getLogger(__name__)


def parse(value: str | None) -> tuple[frozenset[str], str | None]:
    """The UUIDs an annotation value cordons, and a sentence when the value cannot be read (then
    nothing is cordoned). An absent or blank value cordons nothing and is no problem."""
    if value is None or not value.strip():
        return frozenset(), None
    try:
        return frozenset(uuid_entries(HAMI_DEVICE_CORDON, value)), None
    except AnnotationError as error:
        return frozenset(), f"{error} No GPU is cordoned by it."


def cordon_taint(since: str | None) -> DeviceTaint:
    """The taint a cordoned GPU carries; its value says where the cordon came from."""
    return DeviceTaint(CORDONED_TAINT, HAMI_DEVICE_CORDON, since)


class NodeCordon:
    """The cordon the annotation on ``node`` asks for, kept current by :meth:`run`; ``on_change`` is
    called (from the watch's thread) whenever the set of cordoned UUIDs changes. ``published`` gives
    the UUIDs of the GPUs the daemon publishes now, to name those the annotation lists in vain; the
    publisher applies a taint only to a GPU it publishes, so a GPU that appears later (renamed, out
    of MIG mode) is cordoned as soon as it is published."""

    def __init__(
        self,
        core: client.CoreV1Api,
        node: str,
        published: Callable[[], Collection[str]],
    ) -> None:
        self._core = core
        self._node = node
        self._published = published
        self._lock = threading.Lock()
        self._value: str | None = None
        self._since: dict[str, str] = {}
        """Each UUID the annotation cordons and when that was first seen (the taint's timeAdded)."""
        self.on_change: Callable[[], None] = lambda: None
        self.synced = threading.Event()
        """Set once the Node has been read: the first slice waits for it, so that a cordoned GPU is
        not published untainted for a moment when the daemon starts."""

    def taints(self) -> Mapping[str, list[DeviceTaint]]:
        """The taints of each cordoned GPU, by UUID: its cordon taint."""
        with self._lock:
            return {uuid: [cordon_taint(since)] for uuid, since in self._since.items()}

    def run(self, stop: threading.Event) -> None:
        """Watch the Node until ``stop``; a deleted Node cordons nothing (its slice goes with it).

        A failing watch is logged at each retry but leaves readiness alone: the daemon serves claims
        and publishes GPUs without it (the other watches say when the API server is away)."""
        watch_forever(
            self._core.list_node,
            self._on_event,
            stop,
            f"Node {self._node}",
            field_selector=f"metadata.name={self._node}",
        )

    def _on_event(self, kind: str, obj: Mapping[str, Any]) -> None:
        if kind == "SYNCED":
            items = obj.get("items") or []
            self.update(_annotation(items[0]) if items else None)
            self.synced.set()
        else:
            self.update(None if kind == "DELETED" else _annotation(obj))

    def update(self, value: str | None) -> None:
        """Take the annotation's current ``value`` (None: absent); log what it asks that cannot be
        done, and call ``on_change`` if the cordoned GPUs changed."""
        with self._lock:
            if value == self._value:
                return
            self._value = value
            uuids, problem = parse(value)
            if problem is not None:
                log.error("node %s: %s", self._node, problem)
            published = frozenset(self._published())
            unknown = sorted(uuids - published)
            if unknown:
                log.warning(
                    "node %s: %s names %s, not a GPU this daemon publishes on the node (its GPUs: %s)",
                    self._node,
                    HAMI_DEVICE_CORDON,
                    ", ".join(unknown),
                    ", ".join(sorted(published)) or "none",
                )
            changed = uuids != self._since.keys()
            now = _now()
            self._since = {uuid: self._since.get(uuid, now) for uuid in uuids}
        if changed:
            log.info(
                "node %s: GPUs cordoned by %s: %s",
                self._node,
                HAMI_DEVICE_CORDON,
                ", ".join(sorted(uuids & published)) or "none",
            )
            self.on_change()


def _annotation(node: Mapping[str, Any]) -> str | None:
    annotations = node.get("metadata", {}).get("annotations") or {}
    value = annotations.get(HAMI_DEVICE_CORDON)
    return value if isinstance(value, str) else None
