"""A control plane that test modules take turns on, each finding it as the module before it did.

Starting a control plane with Kueue costs about half a minute; the modules whose Kueue
configuration is the same run one after another on one (tests/conftest.py: ``kueue_cluster``).
What a module leaves behind would change what the next one sees: the admission check counts every
GPU slice in the cluster, the modules reuse ClusterQueue and AdmissionCheck names with other quotas,
a leftover webhook would convert the next module's pods. So a module's turn ends by stopping every
process it started beside the control plane and deleting every cluster-scoped object made since
the turn began (its namespaces first, with everything in them), waiting until each is gone.

Objects are compared by UID, so an object the control plane makes again on its own under an old name
is neither mistaken for the one that was there nor waited for once deleted.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from testbed.cluster import LocalCluster
from testbed.kubectl import kubectl
from testbed.node_runtime import Cleanup
from testbed.polling import poll_until
from testbed.process import ManagedProcess

log = logging.getLogger(__name__)

REMOVAL_TIMEOUT = 180.0
"""How long a turn's objects may take to go: a namespace waits for its pods, Jobs and Workloads,
Kueue's objects for their in-use finalizers."""

_FIELDS = (
    '{range .items[*]}{.kind}{"\\t"}{.apiVersion}{"\\t"}{.metadata.name}{"\\t"}{.metadata.uid}{"\\n"}{end}'
)


def cluster_scoped_objects(cluster: LocalCluster) -> dict[str, str]:
    """Every cluster-scoped object the API server serves and lets the admin list and delete, as
    kubectl names it (``kind.group/name``, ``namespace/name``) with its UID: found through discovery,
    so Kueue's kinds and any the API server adds are covered without a list kept here."""
    kinds = kubectl(
        cluster.admin_kubeconfig, "api-resources", "--namespaced=false", "--verbs=list,delete", "-o", "name"
    ).split()
    listed = kubectl(cluster.admin_kubeconfig, "get", ",".join(kinds), "-o", f"jsonpath={_FIELDS}")
    objects: dict[str, str] = {}
    for line in listed.splitlines():
        kind, api_version, name, uid = line.split("\t")
        group = api_version.rpartition("/")[0]
        objects[f"{kind.lower()}.{group}/{name}" if group else f"{kind.lower()}/{name}"] = uid
    return objects


def _still_there(cluster: LocalCluster, deleted: Mapping[str, str]) -> list[str]:
    current = cluster_scoped_objects(cluster)
    return sorted(ref for ref, uid in deleted.items() if current.get(ref) == uid)


def _what_holds(cluster: LocalCluster, ref: str) -> str:
    """One line on why ``ref`` is still there: its finalizers and, for a namespace, its conditions
    (which say what content it still waits for)."""
    text = kubectl(cluster.admin_kubeconfig, "get", ref, "--ignore-not-found", "-o", "json")
    if not text.strip():
        return f"{ref}: gone now"
    obj = json.loads(text)
    finalizers = obj["metadata"].get("finalizers") or obj.get("spec", {}).get("finalizers") or []
    conditions = [c.get("message", "") for c in (obj.get("status") or {}).get("conditions") or []]
    return f"{ref}: finalizers {finalizers}" + "".join(f"; {m}" for m in conditions if m)


def _delete_and_wait(cluster: LocalCluster, deleted: Mapping[str, str], timeout: float) -> None:
    if not deleted:
        return
    kubectl(cluster.admin_kubeconfig, "delete", *sorted(deleted), "--wait=false", "--ignore-not-found")
    try:
        poll_until(lambda: not _still_there(cluster, deleted), timeout, f"{len(deleted)} objects deleted")
    except TimeoutError:
        left = _still_there(cluster, deleted)
        details = "\n".join(_what_holds(cluster, ref) for ref in left)
        raise RuntimeError(
            f"the shared cluster kept {len(left)} objects for {timeout:.0f} s after they were deleted:\n"
            f"{details}"
        ) from None


@dataclass
class Turn:
    """What was in the shared cluster when a module's turn began."""

    cluster: LocalCluster
    objects: dict[str, str]
    processes: list[ManagedProcess]

    @classmethod
    def begin(cls, cluster: LocalCluster) -> Turn:
        return cls(cluster, cluster_scoped_objects(cluster), list(cluster.processes))

    def end(self, timeout: float = REMOVAL_TIMEOUT) -> None:
        """Stop what the module started beside the control plane, then delete what it made: the
        namespaces (their pods deleted at once, since a pod bound to a node without a kubelet is
        never confirmed gone), then every other object. Every step runs even if one fails; the
        first failure is raised at the end."""
        cleanup = Cleanup("shared cluster")
        for process in [p for p in self.cluster.processes if p not in self.processes]:
            with cleanup.step(f"stop {process.name}"):
                process.stop()
                self.cluster.processes.remove(process)
        with cleanup.step("delete the module's objects"):
            made = {
                ref: uid
                for ref, uid in cluster_scoped_objects(self.cluster).items()
                if self.objects.get(ref) != uid
            }
            namespaces = {ref: uid for ref, uid in made.items() if ref.startswith("namespace/")}
            for ref in namespaces:
                kubectl(
                    self.cluster.admin_kubeconfig,
                    "delete",
                    "pods",
                    "--all",
                    "-n",
                    ref.partition("/")[2],
                    "--grace-period=0",
                    "--force",
                    "--ignore-not-found",
                )
            _delete_and_wait(self.cluster, namespaces, timeout)
            _delete_and_wait(self.cluster, {r: u for r, u in made.items() if r not in namespaces}, timeout)
            log.info("shared cluster: %d objects of the module deleted", len(made))
        cleanup.finish()


class SharedCluster:
    """One control plane at a time: started by the first module that asks for it, stopped when the
    caller knows no module after the current one needs it (or at the end of the session)."""

    def __init__(self, make: Callable[[], LocalCluster]) -> None:
        self._make = make
        self._running: LocalCluster | None = None

    def get(self) -> LocalCluster:
        if self._running is None:
            cluster = self._make()
            cluster.start()
            self._running = cluster
        return self._running

    def stop(self) -> None:
        running, self._running = self._running, None
        if running is not None:
            running.stop()
