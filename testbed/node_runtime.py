"""A node's folder and container runtime: containerd with its CNI network, CDI spec directory and
imported images, without a kubelet (node.py adds the kubelet).

Each node has one folder (``NodePaths``) holding everything it writes: containerd's root, state,
socket and CDI spec directory, the CNI config and leases, the kubelet's root dir (and so the DRA plugin
registry and plugin directories a driver is pointed at), pod logs, certificates and daemon logs. What
cannot live in the folder -- the node's bridge, its cgroup tree, mounts, containerd shims -- is taken
and given back through node_host.py. The folder's ``node.json`` names its owner process, so a later
run cleans what a killed run left (``sweep_stale_nodes``).

A runtime on its own is what CRI-level tests use: the kubelet terminates every pod sandbox it did not
create (HandlePodCleanups), so a container made through crictl on a kubelet's runtime would be killed.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import shutil
import subprocess
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from tessera.testbed import node_host
from tessera.testbed.binaries import binary
from tessera.testbed.containerd_config import ContainerdPaths, cni_network_config, containerd_config
from tessera.testbed.images import PAUSE_IMAGE, import_image
from tessera.testbed.process import ManagedProcess

log = logging.getLogger(__name__)

_CONTAINERD_TIMEOUT = 60.0


def node_root() -> Path:
    """Where node folders live: $TESSERA_NODE_ROOT, else /tmp/tessera-nodes. Kept short, because
    the DRA sockets under it must fit the 108-byte limit of a Unix socket path."""
    configured = os.environ.get("TESSERA_NODE_ROOT")
    return Path(configured) if configured else Path(tempfile.gettempdir()) / "tessera-nodes"


@dataclass(frozen=True)
class NodePaths:
    """Every path of one node, all under its folder."""

    root: Path

    @property
    def containerd(self) -> ContainerdPaths:
        return ContainerdPaths(
            root=self.root / "containerd" / "root",
            state=self.containerd_state,
            socket=self.containerd_socket,
            cdi_dir=self.cdi_dir,
            cni_conf_dir=self.root / "cni" / "net.d",
            cni_bin_dir=binary("bridge").parent,
            opt_dir=self.root / "containerd" / "opt",
        )

    @property
    def containerd_socket(self) -> Path:
        """The node's CRI endpoint (and containerd API socket)."""
        return self.root / "containerd" / "containerd.sock"

    @property
    def containerd_state(self) -> Path:
        return self.root / "containerd" / "state"

    @property
    def cdi_dir(self) -> Path:
        """Where the node's runtime reads CDI specs: the DRA driver writes its specs here."""
        return self.root / "cdi"

    @property
    def kubelet_root(self) -> Path:
        return self.root / "kubelet"

    @property
    def plugins_registry(self) -> Path:
        """The kubelet watches this folder for plugin registration sockets (<driver>-reg.sock)."""
        return self.kubelet_root / "plugins_registry"

    @property
    def plugins_dir(self) -> Path:
        """Plugins put their service sockets under here (plugins/<driver>/dra.sock)."""
        return self.kubelet_root / "plugins"

    @property
    def pod_logs(self) -> Path:
        return self.root / "pod-logs"

    @property
    def ipam_dir(self) -> Path:
        return self.root / "cni" / "leases"

    @property
    def log_dir(self) -> Path:
        return self.root / "logs"

    @property
    def info_file(self) -> Path:
        return self.root / "node.json"

    @property
    def crictl_config(self) -> Path:
        """crictl's endpoints for this node: `crictl --config <this> ps -a` by hand, too."""
        return self.root / "crictl.yaml"


def _process_start_time(pid: int) -> str | None:
    """A process's start time in clock ticks since boot (field 22 of /proc/<pid>/stat), which tells
    a live owner from a new process that reuses its PID."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return stat.rpartition(")")[2].split()[19]


class NodeRuntime:
    """One node's folder, bridge, cgroup root and containerd (with the given images imported)."""

    def __init__(self, name: str, images: Sequence[Path]) -> None:
        self.name = name
        self.paths = NodePaths(node_root() / name)
        self.images = list(images)
        self.bridge: node_host.NodeBridge | None = None
        self.containerd: ManagedProcess | None = None

    @property
    def cgroup_root(self) -> str:
        """The node's cgroup (the kubelet's cgroupRoot), the same name in every hierarchy."""
        return f"tessera-{self.name}"

    @property
    def address(self) -> str:
        """The node's IP address: the address of its bridge."""
        assert self.bridge is not None, "node not started"
        return self.bridge.address

    def start(self) -> None:
        """Create the folder, bridge and cgroup root, start containerd, import the images. On any
        failure, give back what was taken before raising."""
        try:
            self._prepare()
            self._start_containerd()
            for archive in self.images:
                import_image(binary("ctr"), self.paths.containerd.socket, archive)
        except BaseException:
            self.stop()
            raise

    def stop(self) -> None:
        """Remove every pod through the CRI, stop containerd, then give back the host resources and
        the folder. Each step runs even if an earlier one failed."""
        if self.containerd is not None and self.containerd.running():
            # Stops and removes every sandbox and its containers, which ends their shims cleanly.
            with contextlib.suppress(subprocess.CalledProcessError, subprocess.TimeoutExpired):
                self.crictl("rmp", "--all", "--force", timeout=60)
        if self.containerd is not None:
            self.containerd.stop()
        release_host_resources(self.paths.root, self.bridge.name if self.bridge else None, self.cgroup_root)

    def _prepare(self) -> None:
        if self.paths.root.exists():
            raise FileExistsError(f"{self.paths.root} exists; node names must be unique")
        for directory in (
            self.paths.log_dir,
            self.paths.cdi_dir,
            self.paths.containerd.cni_conf_dir,
            self.paths.ipam_dir,
            self.paths.pod_logs,
            self.paths.plugins_registry,
            self.paths.plugins_dir,
        ):
            directory.mkdir(parents=True)
        self.bridge = node_host.claim_bridge()
        # Written before anything else is taken, so a killed run can always be swept.
        self.paths.info_file.write_text(
            json.dumps(
                {
                    "name": self.name,
                    "bridge": self.bridge.name,
                    "cgroup_root": self.cgroup_root,
                    "owner_pid": os.getpid(),
                    "owner_start": _process_start_time(os.getpid()),
                }
            )
        )
        node_host.create_cgroup_root(self.cgroup_root)

    def _start_containerd(self) -> None:
        assert self.bridge is not None
        paths = self.paths.containerd
        network = self.bridge.pod_network(self.paths.ipam_dir)
        (paths.cni_conf_dir / "10-tessera.conflist").write_text(cni_network_config(network))
        endpoint = f"unix://{paths.socket}"
        self.paths.crictl_config.write_text(f"runtime-endpoint: {endpoint}\nimage-endpoint: {endpoint}\n")
        config = self.paths.root / "containerd.toml"
        config.write_text(containerd_config(paths, runc=binary("runc"), sandbox_image=PAUSE_IMAGE))
        # containerd starts its shim (containerd-shim-runc-v2) by name from PATH.
        env = dict(os.environ, PATH=f"{binary('containerd').parent}:{os.environ.get('PATH', '')}")
        self.containerd = ManagedProcess(
            "containerd", [binary("containerd"), "--config", config], self.paths.log_dir, env=env
        )
        self.containerd.wait_until(self._runtime_ready, _CONTAINERD_TIMEOUT, "CRI runtime ready")

    def _runtime_ready(self) -> bool:
        conditions = json.loads(self.crictl("info", timeout=10))["status"]["conditions"]
        return all(c["status"] for c in conditions if c["type"] in ("RuntimeReady", "NetworkReady"))

    def crictl(self, *args: str, timeout: float = 30) -> str:
        """Run crictl against this node's containerd and return its standard output."""
        result = subprocess.run(
            [
                str(binary("crictl")),
                "--config",
                str(self.paths.crictl_config),
                "--timeout",
                f"{int(timeout)}s",
                *args,
            ],
            capture_output=True,
            text=True,
            check=True,
            timeout=timeout + 5,
        )
        return result.stdout


def release_host_resources(folder: Path, bridge: str | None, cgroup_root: str) -> None:
    """Give back what a node took outside its daemons, then remove its folder: leftover shims and
    their sockets, containers, the cgroup tree, every mount under the folder, the bridge, and log
    links."""
    node_host.kill_processes_mentioning(str(folder))
    paths = NodePaths(folder)
    tasks = paths.containerd_state / "io.containerd.runtime.v2.task"
    node_host.remove_shim_sockets(paths.containerd_socket, tasks)
    node_host.remove_cgroup_tree(cgroup_root)
    node_host.unmount_all_under(folder)
    if bridge is not None:
        node_host.delete_bridge(bridge)
    node_host.remove_container_log_links(folder)
    shutil.rmtree(folder, ignore_errors=True)


def sweep_stale_nodes(root: Path | None = None) -> list[str]:
    """Clean the folders of nodes whose owner process is gone (a killed test run); return their names."""
    swept: list[str] = []
    base = root or node_root()
    if not base.is_dir():
        return swept
    for info_file in base.glob("*/node.json"):
        try:
            info = json.loads(info_file.read_text())
        except (OSError, ValueError):
            continue
        if _process_start_time(info["owner_pid"]) == info["owner_start"]:
            continue
        log.warning("cleaning node %s left by dead process %s", info["name"], info["owner_pid"])
        release_host_resources(info_file.parent, info["bridge"], info["cgroup_root"])
        swept.append(info["name"])
    return swept
