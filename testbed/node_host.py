"""The machine-wide resources a test-bed node takes, and giving them back: its bridge (address and pod
network), its cgroup tree, its mounts, and processes that outlive the daemons (containerd shims and
the containers they run); and the one kernel limit nodes need raised (inotify instances).

All of these are outside the node's folder, or survive a killed daemon, so node_runtime.py calls here
both to set a node up and to clean it after a stop or a crash. Every clean-up step tolerates finding
nothing.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import logging
import os
import re
import signal
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

from testbed.commands import CommandError, run_checked
from testbed.containerd_config import PodNetwork

log = logging.getLogger(__name__)

BRIDGE_PREFIX = "tessera"
_MAX_NODES = 250
# /var/log/containers holds the kubelet's symlinks to container logs; the kubelet hard-codes it.
CONTAINER_LOG_LINKS = Path("/var/log/containers")


def _ip(*args: str) -> str:
    return run_checked(["ip", *args], timeout=30)


# -- kernel limits -------------------------------------------------------------------------------

INOTIFY_INSTANCES = Path("/proc/sys/fs/inotify/max_user_instances")
NODES_INOTIFY_INSTANCES = 1024
"""Each node's kubelet, containerd and pods' runtimes hold a few inotify instances, all root's: the
kernel's default of 128 a user runs out after a dozen nodes (a whole test session's), and then
whatever starts next - Kueue's certificate watcher, a kubelet - fails with "too many open files"."""


def raise_inotify_instances(minimum: int = NODES_INOTIFY_INSTANCES, limit: Path = INOTIFY_INSTANCES) -> None:
    """Raise the machine's inotify instances a user may hold to ``minimum``, if lower; a higher
    setting is left as it is. Root only, as every node is."""
    current = int(limit.read_text())
    if current >= minimum:
        return
    limit.write_text(f"{minimum}\n")
    log.info("raised %s from %d to %d for the test bed's nodes", limit, current, minimum)


# -- network -------------------------------------------------------------------------------------


@dataclass(frozen=True)
class NodeBridge:
    """A bridge named tessera<index> holding 10.244.<index>.1/24: the node's address and the gateway
    of its pods' subnet.

    Why not 127.0.0.1: the kubelet refuses a loopback node IP (validateNodeIP), and without a node
    IP it would pick the machine's default-route address and bind there. The test machines' kernel
    has no dummy-interface driver, but bridges work; a bridge's address is as local to the machine as
    loopback, each node gets its own, and the CNI bridge plugin adopts the bridge for the node's pods.
    """

    index: int

    @property
    def name(self) -> str:
        return f"{BRIDGE_PREFIX}{self.index}"

    @property
    def address(self) -> str:
        return f"10.244.{self.index}.1"

    def pod_network(self, ipam_dir: Path) -> PodNetwork:
        return PodNetwork(
            name=f"tessera-node-{self.index}",
            bridge=self.name,
            subnet=f"10.244.{self.index}.0/24",
            gateway=self.address,
            ipam_dir=ipam_dir,
        )


def node_addresses() -> list[str]:
    """Every address a node on this machine can have, one per bridge it may claim."""
    return [NodeBridge(index).address for index in range(1, _MAX_NODES + 1)]


def claim_bridge() -> NodeBridge:
    """Create the first free tessera<N> bridge, with its address, and bring it up.

    Creating a link is atomic, so two test processes on one machine cannot claim the same index: a
    name that exists ("File exists", EEXIST) is taken and the next is tried; any other failure is an
    error. If the address or the link state cannot be set, the new bridge is deleted again.
    """
    if os.geteuid() != 0:
        raise PermissionError("a real node needs root: creating its bridge (ip link add) needs CAP_NET_ADMIN")
    for index in range(1, _MAX_NODES + 1):
        bridge = NodeBridge(index)
        try:
            _ip("link", "add", bridge.name, "type", "bridge")
        except CommandError as error:
            if _name_taken(error):
                continue
            raise
        try:
            _ip("addr", "add", f"{bridge.address}/24", "dev", bridge.name)
            _ip("link", "set", bridge.name, "up")
        except BaseException:
            try:
                delete_bridge(bridge.name)
            except Exception:
                log.exception("could not delete bridge %s after failing to set it up", bridge.name)
            raise
        return bridge
    raise RuntimeError(f"no free bridge name {BRIDGE_PREFIX}1..{_MAX_NODES}")


def _name_taken(error: CommandError) -> bool:
    """Whether `ip link add` failed because the name exists (iproute2 prints strerror(EEXIST))."""
    return os.strerror(errno.EEXIST) in (error.stderr or "")


def delete_bridge(name: str) -> None:
    """Remove a node's bridge (the pods' veth ends go with their network namespaces); a bridge that
    is already gone is not an error."""
    if Path("/sys/class/net", name).exists():
        _ip("link", "del", name)


# -- cgroups -------------------------------------------------------------------------------------


def cgroup_mounts() -> list[Path]:
    """Every cgroup hierarchy mounted on this machine (one per v1 controller set, or the v2 root)."""
    mounts: list[Path] = []
    for line in Path("/proc/self/mounts").read_text().splitlines():
        fields = line.split()
        if len(fields) > 2 and fields[2] in ("cgroup", "cgroup2"):
            mounts.append(Path(_unescape(fields[1])))
    return mounts


def create_cgroup_root(name: str) -> None:
    """Create /<name> in every hierarchy: the kubelet's cgroupRoot must exist in each controller.

    On v1 a new cpuset cgroup starts with no CPUs and memory nodes, and nothing can join it until
    they are set; copy them from the parent as `cgroup.clone_children` would.
    """
    for mount in cgroup_mounts():
        group = mount / name
        group.mkdir(exist_ok=True)
        for knob in ("cpuset.cpus", "cpuset.mems"):
            if (group / knob).exists() and not (group / knob).read_text().strip():
                (group / knob).write_text((mount / knob).read_text())


def remove_cgroup_tree(name: str, timeout: float = 10.0) -> None:
    """Kill whatever still runs in /<name> (the node's containers) and remove its cgroups,
    deepest first, in every hierarchy."""
    for mount in cgroup_mounts():
        top = mount / name
        if not top.is_dir():
            continue
        deadline = time.monotonic() + timeout
        groups = sorted((p for p in top.rglob("*") if p.is_dir()), key=lambda p: len(p.parts), reverse=True)
        for group in [*groups, top]:
            while True:
                _kill_members(group)
                try:
                    group.rmdir()
                    break
                except FileNotFoundError:
                    break
                except OSError:
                    if time.monotonic() > deadline:
                        log.warning("could not remove cgroup %s", group)
                        break
                    time.sleep(0.1)


def _kill_members(group: Path) -> None:
    with contextlib.suppress(OSError):
        for pid in (group / "cgroup.procs").read_text().split():
            with contextlib.suppress(ProcessLookupError):
                os.kill(int(pid), signal.SIGKILL)


# -- mounts and processes ------------------------------------------------------------------------


_OCTAL_ESCAPE = re.compile(r"\\([0-7]{3})")


def _unescape(field: str) -> str:
    """Decode the octal escapes of /proc mount tables: the kernel writes a space, tab, newline or
    backslash in a path as \\040, \\011, \\012 or \\134 and every other character as it is."""
    return _OCTAL_ESCAPE.sub(lambda match: chr(int(match.group(1), 8)), field)


def mounts_under(directory: Path, mountinfo: Path = Path("/proc/self/mountinfo")) -> list[Path]:
    """Mount points at or below `directory`, deepest first (the order they can be unmounted in)."""
    prefix = str(directory).rstrip("/")
    points: list[Path] = []
    for line in mountinfo.read_text().splitlines():
        point = _unescape(line.split()[4])
        if point == prefix or point.startswith(prefix + "/"):
            points.append(Path(point))
    return sorted(points, key=lambda p: len(p.parts), reverse=True)


def unmount_all_under(directory: Path) -> None:
    """Lazily unmount everything at or below `directory`: pod volumes, container root filesystems,
    network-namespace pins and the kubelet's own bind mount of its root dir (made rshared at start)."""
    for _ in range(5):  # a mount stacked on another shows up again after the top one goes
        points = mounts_under(directory)
        if not points:
            return
        for point in points:
            subprocess.run(["umount", "--lazy", str(point)], capture_output=True, check=False)
    log.warning("mounts left under %s: %s", directory, mounts_under(directory))


def processes_mentioning(text: str) -> list[int]:
    """PIDs whose command line contains `text` (a node's unique folder): its containerd shims,
    started with the node's socket in their arguments, which outlive a killed containerd."""
    found: list[int] = []
    needle = text.encode()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        with contextlib.suppress(OSError):
            if needle in (entry / "cmdline").read_bytes():
                found.append(int(entry.name))
    return found


def kill_processes_mentioning(text: str) -> None:
    for pid in processes_mentioning(text):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


SHIM_SOCKET_DIR = Path("/run/containerd/s")


def remove_shim_sockets(containerd_socket: Path, task_state: Path) -> None:
    """Remove the sockets of a node's containerd shims, which a shim killed outright leaves behind.

    For root, containerd hard-codes the shim socket folder (/run/containerd/s, not under its state
    dir: socket paths must stay short) and names each socket after the SHA-256 of
    "<containerd socket>/<namespace>/<task id>". The task ids are the folders of the node's task
    state dir (<state>/io.containerd.runtime.v2.task/<namespace>/<id>), so the names can be rebuilt.
    """
    for task in task_state.glob("*/*"):
        for debug in (False, True):
            shim_socket(containerd_socket, task.parent.name, task.name, debug=debug).unlink(missing_ok=True)


def shim_socket(containerd_socket: Path, namespace: str, task_id: str, *, debug: bool = False) -> Path:
    """Where containerd puts the socket of the shim for one task (CreateSocketAddress in containerd's
    pkg/shim): /run/containerd/s/<sha256 of "<containerd socket>/<namespace>/<task id>[/debug]">."""
    key = f"{containerd_socket}/{namespace}/{task_id}" + ("/debug" if debug else "")
    return SHIM_SOCKET_DIR / hashlib.sha256(key.encode()).hexdigest()


def remove_container_log_links(directory: Path) -> None:
    """Remove the kubelet's /var/log/containers symlinks that point into a node's folder."""
    if not CONTAINER_LOG_LINKS.is_dir():
        return
    prefix = str(directory).rstrip("/") + "/"
    for link in CONTAINER_LOG_LINKS.iterdir():
        with contextlib.suppress(OSError):
            if link.is_symlink() and os.readlink(link).startswith(prefix):
                link.unlink()
