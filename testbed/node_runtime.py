"""A node's folder and container runtime: containerd with its CNI network, CDI spec directory and
imported images, without a kubelet (node.py adds the kubelet).

Each node has one folder (``NodePaths``) holding everything it writes: containerd's root, state,
socket and CDI spec directory, the CNI config and leases, the kubelet's root dir (and so the DRA plugin
registry and plugin directories a driver is pointed at), pod logs, certificates and daemon logs. What
cannot live in the folder -- the node's bridge, its cgroup tree, mounts, containerd shims -- is taken
and given back through node_host.py. The folder's ``node.json``, written as soon as the folder exists
and again once the bridge is claimed, names its owner process and what it took, so a later run cleans
what a killed run left (``sweep_stale_nodes``).

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
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from tessera.files import write_atomically
from testbed import node_host
from testbed.binaries import binary
from testbed.commands import CommandError, run_checked
from testbed.containerd_config import ContainerdPaths, cni_network_config, containerd_config
from testbed.images import PAUSE_IMAGE, import_image
from testbed.process import ManagedProcess

log = logging.getLogger(__name__)

_CONTAINERD_TIMEOUT = 60.0
# A folder under the node root without node.json is one whose creator was killed before writing it
# (nothing outside the folder is taken before then), or one being created right now: the age tells.
_UNCLAIMED_FOLDER_AGE = 300.0


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
            cni_conf_dir=self.cni_conf_dir,
            cni_bin_dir=binary("bridge").parent,
            opt_dir=self.root / "containerd" / "opt",
            runc_root=self.root / "runc",
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
    def cni_conf_dir(self) -> Path:
        return self.root / "cni" / "net.d"

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


class Cleanup:
    """Clean-up steps that each run even if an earlier one failed: a failing step is logged with what
    it was cleaning, and finish() raises the first error once every step has run."""

    def __init__(self, subject: str) -> None:
        self.subject = subject
        self.errors: list[Exception] = []

    @contextlib.contextmanager
    def step(self, what: str) -> Iterator[None]:
        try:
            yield
        except Exception as error:
            log.error("%s: %s failed: %s", self.subject, what, error, exc_info=True)
            self.errors.append(error)

    def finish(self) -> None:
        if self.errors:
            raise self.errors[0]


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
        # Whether this object created the folder (and so may have taken host resources) and has not
        # given it back yet: stop() releases only then, and only once.
        self._owns_folder = False

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
        failure, give back what was taken before raising. A folder that exists already belongs to
        another node of the same name and is left alone."""
        node_root().mkdir(parents=True, exist_ok=True)
        try:
            self.paths.root.mkdir()
        except FileExistsError:
            raise FileExistsError(f"{self.paths.root} exists; node names must be unique") from None
        self._owns_folder = True
        try:
            self._write_info()
            self._prepare()
            self._start_containerd()
            for archive in self.images:
                import_image(binary("ctr"), self.paths.containerd.socket, archive)
        except BaseException:
            with contextlib.suppress(Exception):  # stop() logs its own failures; keep the first error
                self.stop()
            raise

    def stop(self) -> None:
        """Remove every pod through the CRI, stop containerd, then give back the host resources and
        the folder. Each step runs even if an earlier one failed (the first error is raised at the
        end); what was given back is forgotten, so a second stop() does nothing."""
        cleanup = Cleanup(f"runtime {self.name}")
        containerd, self.containerd = self.containerd, None
        if containerd is not None:
            if containerd.running():
                # Stops and removes every sandbox and its containers, which ends their shims cleanly.
                # If that fails, release_host_resources kills them instead.
                try:
                    self.crictl("rmp", "--all", "--force", timeout=60)
                except (CommandError, subprocess.TimeoutExpired) as error:
                    log.warning("runtime %s: removing its pods through the CRI failed: %s", self.name, error)
            with cleanup.step("stop containerd"):
                containerd.stop()
        if self._owns_folder:
            bridge, self.bridge = self.bridge, None
            self._owns_folder = False
            with cleanup.step("give back its host resources"):
                release_host_resources(self.paths.root, bridge.name if bridge else None, self.cgroup_root)
        cleanup.finish()

    def _write_info(self) -> None:
        """Write node.json (atomically): the owner process and every host resource taken so far."""
        info = {
            "name": self.name,
            "bridge": self.bridge.name if self.bridge else None,
            "cgroup_root": self.cgroup_root,
            "owner_pid": os.getpid(),
            "owner_start": _process_start_time(os.getpid()),
        }
        write_atomically(self.paths.info_file, json.dumps(info))

    def _prepare(self) -> None:
        for directory in (
            self.paths.log_dir,
            self.paths.cdi_dir,
            self.paths.cni_conf_dir,
            self.paths.ipam_dir,
            self.paths.pod_logs,
            self.paths.plugins_registry,
            self.paths.plugins_dir,
        ):
            directory.mkdir(parents=True)
        # node.json already names the cgroup root; a kill between claiming the bridge and recording
        # it is the one moment a sweep would miss something (the bridge).
        self.bridge = node_host.claim_bridge()
        self._write_info()
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
        """Whether containerd reports both RuntimeReady and NetworkReady true (a condition not yet
        reported is not ready)."""
        conditions = json.loads(self.crictl("info", timeout=10))["status"]["conditions"] or []
        status = {c["type"]: c["status"] for c in conditions}
        return status.get("RuntimeReady") is True and status.get("NetworkReady") is True

    def crictl(self, *args: str, timeout: float = 30) -> str:
        """Run crictl against this node's containerd and return its standard output (CommandError,
        with crictl's standard error, if it fails)."""
        return run_checked(
            [
                binary("crictl"),
                "--config",
                self.paths.crictl_config,
                "--timeout",
                f"{int(timeout)}s",
                *args,
            ],
            timeout=timeout + 5,
        )


def release_host_resources(folder: Path, bridge: str | None, cgroup_root: str) -> None:
    """Give back what a node took outside its daemons, then remove its folder: leftover shims and
    their sockets, containers, the cgroup tree, every mount under the folder, the bridge, and log
    links. Each step runs even if an earlier one failed; the first error is raised at the end."""
    cleanup = Cleanup(f"node folder {folder}")
    paths = NodePaths(folder)
    with cleanup.step("kill the processes left in it"):
        node_host.kill_processes_mentioning(str(folder))
    with cleanup.step("remove its shim sockets"):
        tasks = paths.containerd_state / "io.containerd.runtime.v2.task"
        node_host.remove_shim_sockets(paths.containerd_socket, tasks)
    with cleanup.step(f"remove cgroup /{cgroup_root}"):
        node_host.remove_cgroup_tree(cgroup_root)
    with cleanup.step("unmount everything under it"):
        node_host.unmount_all_under(folder)
    if bridge is not None:
        with cleanup.step(f"delete bridge {bridge}"):
            node_host.delete_bridge(bridge)
    with cleanup.step("remove its /var/log/containers links"):
        node_host.remove_container_log_links(folder)
    with cleanup.step("remove the folder"):
        _remove_folder(folder)
    cleanup.finish()


def _remove_folder(folder: Path) -> None:
    """Remove a folder tree; once more after a moment if a just-killed process still held a file."""
    try:
        shutil.rmtree(folder)
    except FileNotFoundError:
        pass
    except OSError:
        time.sleep(0.5)
        shutil.rmtree(folder)


def sweep_stale_nodes(root: Path | None = None) -> list[str]:
    """Clean the folders of nodes whose owner process is gone (a killed test run); return their names.

    A folder whose node.json names a live owner (same PID, same start time) is left alone. A folder
    without a readable node.json is removed once it is older than a few minutes: its creator took
    nothing outside it. Every stale node is cleaned even if cleaning another fails; the first error is
    raised at the end.
    """
    swept: list[str] = []
    base = root or node_root()
    if not base.is_dir():
        return swept
    cleanup = Cleanup("sweep")
    for folder in sorted(p for p in base.iterdir() if p.is_dir()):
        try:
            info = json.loads((folder / "node.json").read_text())
            owner_pid, owner_start = int(info["owner_pid"]), info["owner_start"]
            name, bridge, cgroup_root = info["name"], info.get("bridge"), info["cgroup_root"]
        except (OSError, ValueError, KeyError, TypeError):
            with cleanup.step(f"remove unclaimed folder {folder}"):
                if time.time() - folder.stat().st_mtime > _UNCLAIMED_FOLDER_AGE:
                    log.warning("removing node folder %s, which has no node.json", folder)
                    _remove_folder(folder)
            continue
        if owner_start is not None and _process_start_time(owner_pid) == owner_start:
            continue
        log.warning("cleaning node %s left by dead process %s", name, owner_pid)
        with cleanup.step(f"clean node {name}"):
            release_host_resources(folder, bridge, cgroup_root)
            swept.append(name)
    cleanup.finish()
    return swept
