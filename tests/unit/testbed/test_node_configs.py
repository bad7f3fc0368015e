"""The configuration files a real node is started with say what node.py relies on: every path of the
node is its own, and the settings the test machines need (cgroup v1, no CAP_SYS_RESOURCE) are there."""

from __future__ import annotations

import json
import tomllib
from pathlib import Path

from testbed.containerd_config import (
    ContainerdPaths,
    PodNetwork,
    cni_network_config,
    containerd_config,
)
from testbed.kubelet_config import KubeletSettings, kubelet_configuration, kubelet_flags
from testbed.pki import KeyPair


def containerd_paths(root: Path) -> ContainerdPaths:
    return ContainerdPaths(
        root=root / "root",
        state=root / "state",
        socket=root / "c.sock",
        cdi_dir=root / "cdi",
        cni_conf_dir=root / "net.d",
        cni_bin_dir=root / "bin",
        opt_dir=root / "opt",
        runc_root=root / "runc",
    )


def test_containerd_config_is_valid_toml_with_every_path_under_the_node(tmp_path: Path) -> None:
    """The config parses as TOML (version 3) and points root, state, socket, CDI and CNI folders and
    runc's state root at the node, with the pinned runc and the locally built sandbox image."""
    paths = containerd_paths(tmp_path)
    config = tomllib.loads(containerd_config(paths, runc=Path("/x/runc"), sandbox_image="local/pause:v1"))
    assert (config["version"], config["root"], config["state"]) == (3, str(paths.root), str(paths.state))
    assert config["grpc"]["address"] == str(paths.socket)
    plugins = config["plugins"]
    runtime = plugins["io.containerd.cri.v1.runtime"]
    assert runtime["cdi_spec_dirs"] == [str(paths.cdi_dir)]
    assert runtime["netns_mounts_under_state_dir"] is True
    assert runtime["restrict_oom_score_adj"] is True
    assert runtime["cni"]["conf_dir"] == str(paths.cni_conf_dir)
    runc_options = runtime["containerd"]["runtimes"]["runc"]["options"]
    assert (runc_options["BinaryName"], runc_options["Root"]) == ("/x/runc", str(paths.runc_root))
    assert plugins["io.containerd.cri.v1.images"]["pinned_images"]["sandbox"] == "local/pause:v1"
    assert plugins["io.containerd.nri.v1.nri"]["disable"] is True


def test_cni_config_uses_the_nodes_bridge_and_keeps_leases_in_the_node(tmp_path: Path) -> None:
    """One bridge plugin on the node's bridge, host-local leases in the node's folder, no iptables."""
    network = PodNetwork("net-3", "tessera3", "10.244.3.0/24", "10.244.3.1", tmp_path / "leases")
    (plugin,) = json.loads(cni_network_config(network))["plugins"]
    assert (plugin["type"], plugin["bridge"], plugin["ipMasq"]) == ("bridge", "tessera3", False)
    assert plugin["ipam"]["dataDir"] == str(tmp_path / "leases")
    assert plugin["ipam"]["ranges"] == [[{"subnet": "10.244.3.0/24", "gateway": "10.244.3.1"}]]


def test_kubelet_configuration_carries_the_per_node_and_machine_settings(tmp_path: Path) -> None:
    """Per node: address, ports, root and log folders, cgroup root, runtime socket. For the machines:
    cgroup v1 allowed, cgroupfs driver, own oom_score_adj kept, no iptables chains."""
    settings = KubeletSettings(
        node_name="node-a",
        node_ip="10.244.1.1",
        port=10250,
        healthz_port=10248,
        root_dir=tmp_path / "kubelet",
        pod_logs_dir=tmp_path / "logs",
        cgroup_root="/tessera-node-a",
        containerd_socket=tmp_path / "c.sock",
        client_ca=tmp_path / "ca.crt",
        serving=KeyPair(tmp_path / "s.crt", tmp_path / "s.key"),
    )
    config = kubelet_configuration(settings)
    assert (config["address"], config["port"], config["readOnlyPort"]) == ("10.244.1.1", 10250, 0)
    assert config["containerRuntimeEndpoint"] == f"unix://{tmp_path / 'c.sock'}"
    assert config["cgroupRoot"] == "/tessera-node-a"
    assert (config["cgroupDriver"], config["failCgroupV1"], config["oomScoreAdj"]) == ("cgroupfs", False, 0)
    assert config["authorization"] == {"mode": "Webhook"}
    flags = kubelet_flags(settings, tmp_path / "k.json", tmp_path / "k.kubeconfig")
    assert f"--root-dir={tmp_path / 'kubelet'}" in flags
    assert "--hostname-override=node-a" in flags
    assert "--node-ip=10.244.1.1" in flags
