"""Real Kubernetes nodes on one machine: a containerd and a kubelet per node, registered with a
LocalCluster and Ready, with images imported from local archives (no registry is ever contacted).

A node's folder, network, cgroups and containerd are node_runtime.py's; this module adds the kubelet
(certificates from the cluster CA, its configuration from kubelet_config.py) and the start-up and
clean-up order around it. ``NodeFactory`` starts nodes on demand for a test session.

By hand: ``tessera-cluster up --nodes 2`` starts a control plane and two nodes and
prints their paths; Ctrl-C stops and cleans everything. ``... sweep`` cleans what killed runs left.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Iterator, Sequence
from pathlib import Path

from kubernetes import client
from kubernetes.client import ApiException

from tessera.kube import api_client
from testbed.binaries import binary, ensure_built
from testbed.cluster import LocalCluster, write_kubeconfig
from testbed.images import standard_images
from testbed.kubelet_config import KubeletSettings, kubelet_flags, write_kubelet_configuration
from testbed.names import unique_name
from testbed.node_host import raise_inotify_instances
from testbed.node_runtime import Cleanup, NodePaths, NodeRuntime, sweep_stale_nodes
from testbed.process import ManagedProcess, free_port

log = logging.getLogger(__name__)

NODE_COMPONENTS = ("kubernetes", "containerd", "runc", "cri-tools", "cni-plugins")
MAX_LIVE_NODES = 4
"""How many kubelets one process may run at once: the session's shared node plus the most one test
module starts (three). Each costs about 170 MiB and a share of two cores; a module that forgets its
nodes would otherwise pile them up for the rest of the session."""
_READY_TIMEOUT = 120.0
_NOT_READY_TAINT = "node.kubernetes.io/not-ready"


class RealNode:
    """One node: its runtime (containerd and host resources) and its kubelet."""

    def __init__(self, cluster: LocalCluster, images: Sequence[Path], name: str | None = None) -> None:
        self.cluster = cluster
        self.name = name or unique_name("node")
        self.runtime = NodeRuntime(self.name, images)
        self.kubelet: ManagedProcess | None = None
        self.startup_seconds = 0.0
        self._core = client.CoreV1Api(api_client(cluster.admin_kubeconfig))

    @property
    def paths(self) -> NodePaths:
        return self.runtime.paths

    @property
    def address(self) -> str:
        return self.runtime.address

    def start(self) -> None:
        """Start the runtime, then the kubelet, and wait until the Node is Ready. On any failure,
        clean up what was set up before raising."""
        began = time.monotonic()
        try:
            self.runtime.start()
            self._start_kubelet()
        except BaseException:
            with contextlib.suppress(Exception):  # stop() logs its own failures; keep the first error
                self.stop()
            raise
        self.startup_seconds = time.monotonic() - began
        log.info(
            "node %s Ready in %.1fs at %s (folder %s)",
            self.name,
            self.startup_seconds,
            self.address,
            self.paths.root,
        )

    def stop(self) -> None:
        """Stop the kubelet first (so it restarts nothing), then the runtime (which removes every pod
        and gives back the host resources), then delete the Node object, so the scheduler never
        places a pod on a node that is gone. Each step runs even if an earlier one failed (the first
        error is raised at the end); a second stop() does nothing."""
        cleanup = Cleanup(f"node {self.name}")
        kubelet, self.kubelet = self.kubelet, None
        if kubelet is not None:
            with cleanup.step("stop the kubelet"):
                kubelet.stop()
        with cleanup.step("stop the runtime"):
            self.runtime.stop()
        if kubelet is not None:  # only a kubelet registers the Node object
            with cleanup.step("delete the Node object"):
                try:
                    self._core.delete_node(self.name, _request_timeout=30)
                except ApiException as error:
                    if error.status != 404:
                        raise
        cleanup.finish()

    def restart_kubelet(self) -> None:
        """Stop the kubelet and start it again, as an upgrade or a crash would; wait until Ready.
        Its pods keep running in containerd meanwhile."""
        kubelet, self.kubelet = self.kubelet, None
        if kubelet is not None:
            kubelet.stop()
        self._start_kubelet()

    def _start_kubelet(self) -> None:
        ca = self.cluster.ca
        assert ca is not None, "cluster not started"
        # The Node authorizer and NodeRestriction know a kubelet by exactly this identity.
        client_pair = ca.issue(
            f"kubelet-{self.name}",
            common_name=f"system:node:{self.name}",
            organizations=("system:nodes",),
            client=True,
        )
        serving = ca.issue(
            f"kubelet-serving-{self.name}",
            common_name=self.name,
            dns_names=(self.name,),
            ip_addresses=(self.address,),
            server=True,
        )
        kubeconfig = write_kubeconfig(
            self.paths.root / "kubelet.kubeconfig",
            self.cluster.server,
            ca.pair.cert,
            client_pair,
            f"system:node:{self.name}",
        )
        settings = KubeletSettings(
            node_name=self.name,
            node_ip=self.address,
            port=free_port(),
            healthz_port=free_port(),
            root_dir=self.paths.kubelet_root,
            pod_logs_dir=self.paths.pod_logs,
            cgroup_root=f"/{self.runtime.cgroup_root}",
            containerd_socket=self.paths.containerd.socket,
            client_ca=ca.pair.cert,
            serving=serving,
        )
        config = write_kubelet_configuration(settings, self.paths.root / "kubelet-config.json")
        self.kubelet = ManagedProcess(
            "kubelet", [binary("kubelet"), *kubelet_flags(settings, config, kubeconfig)], self.paths.log_dir
        )
        self.kubelet.wait_until(self.ready, _READY_TIMEOUT, f"Node {self.name} Ready")
        self._remove_not_ready_taint()

    def _remove_not_ready_taint(self) -> None:
        """Do the one job of the node-lifecycle controller that real nodes need.

        The API server taints every new Node node.kubernetes.io/not-ready:NoSchedule (admission
        plugin TaintNodesByCondition), and the node-lifecycle controller lifts it once the node is
        Ready. The test bed runs the controller manager without that controller (it would taint the
        kubelet-less fake nodes), so the taint is lifted here, after the kubelet reports Ready.
        """
        node = self._core.read_node(self.name)
        taints = [t for t in ((node.spec.taints if node.spec else None) or []) if t.key != _NOT_READY_TAINT]
        self._core.patch_node(self.name, {"spec": {"taints": taints}})

    def ready(self) -> bool:
        """Whether the Node object reports Ready=True."""
        try:
            node = self._core.read_node(self.name)
        except ApiException:
            return False
        conditions = (node.status.conditions if node.status else None) or []
        return any(c.type == "Ready" and c.status == "True" for c in conditions)

    def crictl(self, *args: str, timeout: float = 30) -> str:
        """Run crictl against this node's containerd and return its standard output."""
        return self.runtime.crictl(*args, timeout=timeout)

    def rss_bytes(self) -> int:
        """Resident memory of the node's kubelet and containerd (shims and containers not counted)."""
        total = 0
        for process in (self.kubelet, self.runtime.containerd):
            if process is None or not process.running():
                continue
            for line in Path(f"/proc/{process.pid}/status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    total += int(line.split()[1]) * 1024
        return total

    def log_tails(self, lines: int = 60) -> dict[str, str]:
        """The last lines of this node's containerd and kubelet logs, for a failing test's report."""
        processes = (self.runtime.containerd, self.kubelet)
        return {f"{self.name} {p.name}": p.log_tail(lines) for p in processes if p is not None}


_live_nodes: set[RealNode] = set()
"""Nodes some factory of this process started and has not stopped yet."""


class NodeFactory:
    """Starts real nodes (and kubelet-less runtimes) for one cluster on demand, and stops them all at
    the end. The standard images (pod sandbox, tools) come from the cache (built there on first use)
    and are imported into each."""

    def __init__(self, cluster: LocalCluster) -> None:
        self.cluster = cluster
        self.nodes: list[RealNode] = []
        self.runtimes: list[NodeRuntime] = []
        self._images: list[Path] = []

    def _standard_images(self) -> list[Path]:
        if not self._images:
            ensure_built(*NODE_COMPONENTS)
            raise_inotify_instances()
            sweep_stale_nodes()
            self._images = standard_images()
        return self._images

    def start(self, count: int = 1, extra_images: Sequence[Path] = ()) -> list[RealNode]:
        """Start `count` nodes, one after the other, each Ready before the next starts. Refused
        (RuntimeError, naming the live nodes) where this process would run more than
        :data:`MAX_LIVE_NODES` kubelets: nodes are given back by the factory that started them,
        and one that was not is a leak to fix, not to live with."""
        live = [node.name for node in _live_nodes]
        if len(live) + count > MAX_LIVE_NODES:
            raise RuntimeError(
                f"starting {count} more node(s) would make {len(live) + count} kubelets in this process,"
                f" over the test bed's bound of {MAX_LIVE_NODES}; live: {', '.join(live)}"
            )
        started: list[RealNode] = []
        for _ in range(count):
            node = RealNode(self.cluster, [*self._standard_images(), *extra_images])
            self.nodes.append(node)
            _live_nodes.add(node)
            node.start()
            started.append(node)
        return started

    def start_runtime(self, extra_images: Sequence[Path] = ()) -> NodeRuntime:
        """Start a node's runtime alone (no kubelet), for tests that drive the CRI directly."""
        runtime = NodeRuntime(unique_name("runtime"), [*self._standard_images(), *extra_images])
        self.runtimes.append(runtime)
        runtime.start()
        return runtime

    def log_tails(self) -> dict[str, str]:
        """Log tails of every node and runtime started here."""
        tails: dict[str, str] = {}
        for node in self.nodes:
            tails.update(node.log_tails())
        for runtime in self.runtimes:
            if runtime.containerd is not None:
                tails[f"{runtime.name} containerd"] = runtime.containerd.log_tail(60)
        return tails

    def stop_all(self) -> None:
        """Stop everything started here, newest first. Every node and runtime is stopped even if
        stopping another fails; the first error is raised at the end."""
        cleanup = Cleanup("node factory")
        for node in reversed(self.nodes):
            with cleanup.step(f"stop node {node.name}"):
                node.stop()
                _live_nodes.discard(node)
        for runtime in reversed(self.runtimes):
            with cleanup.step(f"stop runtime {runtime.name}"):
                runtime.stop()
        self.nodes.clear()
        self.runtimes.clear()
        cleanup.finish()


@contextlib.contextmanager
def running_nodes(cluster: LocalCluster, count: int) -> Iterator[list[RealNode]]:
    """`count` Ready nodes for the duration of a with-block."""
    factory = NodeFactory(cluster)
    try:
        yield factory.start(count)
    finally:
        factory.stop_all()
