"""containerd's configuration for one test-bed node, and the CNI network its pods join.

Several containerd daemons run side by side on one machine, so every path a containerd would take
from its defaults (/var/lib/containerd, /run/containerd, /run/containerd/runc, /etc/cdi,
/etc/cni/net.d, /opt/cni/bin, /var/run/netns, the NRI socket) is set here to a folder of its own node.
Each setting carries its reason; a setting left at its default is one that does not collide and does
not matter here.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class ContainerdPaths:
    """Where one node's containerd keeps its state, listens, and finds CDI specs and CNI plugins."""

    root: Path
    state: Path
    socket: Path
    cdi_dir: Path
    cni_conf_dir: Path
    cni_bin_dir: Path
    opt_dir: Path
    runc_root: Path


def _toml_string(value: str | Path) -> str:
    return json.dumps(str(value))  # a JSON string is a valid TOML basic string


def containerd_config(paths: ContainerdPaths, *, runc: Path, sandbox_image: str) -> str:
    """The config.toml (version 3, the format containerd 2.x documents) for one node."""
    s = _toml_string
    return f"""# Written by testbed.containerd_config for one test-bed node.
version = 3
root = {s(paths.root)}
state = {s(paths.state)}

[grpc]
  # The CRI endpoint of this node's kubelet and crictl; ctr uses it too. The ttrpc socket for shims
  # is derived from it (<socket>.ttrpc), so it is per node as well.
  address = {s(paths.socket)}

[plugins]
  # NRI listens on /var/run/nri/nri.sock by default: one socket per machine, which a second
  # containerd would fight over. Nothing in the test bed uses NRI.
  [plugins.'io.containerd.nri.v1.nri']
    disable = true

  # Default /opt/containerd: keep this node's files inside its own folder.
  [plugins.'io.containerd.internal.v1.opt']
    path = {s(paths.opt_dir)}

  [plugins.'io.containerd.cri.v1.images']
    # overlayfs is what production nodes use and the machine's kernel has; the node folder must be
    # on a filesystem overlayfs accepts as upper dir (ext4, xfs; not overlayfs itself).
    snapshotter = 'overlayfs'

    [plugins.'io.containerd.cri.v1.images'.pinned_images]
      # Built from images/pause.c and imported at node start; pinned, so never pulled or collected.
      sandbox = {s(sandbox_image)}

  [plugins.'io.containerd.cri.v1.runtime']
    # Lowering a process's oom_score_adj needs CAP_SYS_RESOURCE, which the sandboxes the test bed
    # runs in do not grant even to root: runc then fails every pod sandbox (-998) and Guaranteed
    # container (-997) with "failed to update /proc/self/oom_score_adj: Permission denied". This
    # clamps the scores at containerd's own instead; the OOM-kill order is not under test.
    restrict_oom_score_adj = true
    # The DRA driver writes the claim's CDI spec into this node's folder; the runtime reads it from
    # there when the kubelet passes the CDI device names in CreateContainer.
    cdi_spec_dirs = [{s(paths.cdi_dir)}]
    # Network namespaces are bind-mounted under the state dir instead of the shared /var/run/netns,
    # so cleaning a node's folder cleans its namespaces.
    netns_mounts_under_state_dir = true

    [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc.options]
      # The runc built by build-binaries.sh, not whatever is on PATH.
      BinaryName = {s(runc)}
      # runc's state (one folder per container, under <Root>/<namespace>) goes in the node's folder
      # instead of the shared default /run/containerd/runc, so cleaning the node's folder cleans it.
      Root = {s(paths.runc_root)}
      # No systemd runs the test machines (PID 1 is not systemd); the kubelet's cgroupDriver is
      # cgroupfs too, and the two must agree.
      SystemdCgroup = false

    [plugins.'io.containerd.cri.v1.runtime'.cni]
      bin_dirs = [{s(paths.cni_bin_dir)}]
      conf_dir = {s(paths.cni_conf_dir)}
      # containerd brings up the pod's loopback itself, so only the bridge and host-local plugins
      # need building.
      use_internal_loopback = true

  [plugins.'io.containerd.grpc.v1.cri']
    # Exec, attach and port-forward streams: loopback only, on a port the kernel picks, so several
    # containerds do not collide (the kubelet proxies the API server's streams to it).
    stream_server_address = '127.0.0.1'
    stream_server_port = '0'
"""


@dataclass(frozen=True)
class PodNetwork:
    """One node's pod network: a Linux bridge that also carries the node's own address."""

    name: str
    bridge: str
    subnet: str
    gateway: str
    ipam_dir: Path


def cni_network_config(network: PodNetwork) -> str:
    """A CNI conflist for the node's bridge.

    The kubelet reports a node Ready only when the runtime reports NetworkReady, which containerd
    does once a CNI config loads. A bridge with host-local addresses is the plainest real network:
    pods get an address on the node's own subnet and reach the node through the bridge. No
    masquerading or port mapping: both need iptables, and nothing here needs to leave the machine.
    host-local keeps its leases in the node's folder, not /var/lib/cni.
    """
    conflist = {
        "cniVersion": "1.0.0",
        "name": network.name,
        "plugins": [
            {
                "type": "bridge",
                "bridge": network.bridge,
                "isGateway": True,
                "ipMasq": False,
                "ipam": {
                    "type": "host-local",
                    "dataDir": str(network.ipam_dir),
                    "ranges": [[{"subnet": network.subnet, "gateway": network.gateway}]],
                },
            }
        ],
    }
    return json.dumps(conflist, indent=2) + "\n"
