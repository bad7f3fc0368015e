"""The kubelet's configuration for one test-bed node: a KubeletConfiguration file and its flags.

Several kubelets share one machine, one kernel and one cgroup tree, and the machines are cgroup v1
without systemd. Every setting below that differs from the kubelet's default says why; the rest are
left to the defaults a production node would have.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from testbed.pki import KeyPair


@dataclass(frozen=True)
class KubeletSettings:
    """What differs between the kubelets of one machine."""

    node_name: str
    node_ip: str
    port: int
    healthz_port: int
    root_dir: Path
    pod_logs_dir: Path
    cgroup_root: str
    containerd_socket: Path
    client_ca: Path
    serving: KeyPair


def kubelet_configuration(settings: KubeletSettings) -> dict[str, object]:
    """The KubeletConfiguration (kubelet.config.k8s.io/v1beta1) as a JSON-ready dict."""
    return {
        "apiVersion": "kubelet.config.k8s.io/v1beta1",
        "kind": "KubeletConfiguration",
        # Serve only on the node's own address (its bridge, see node_host.py); the API server reaches
        # logs and exec there. The port is free-picked because all kubelets share the machine.
        "address": settings.node_ip,
        "port": settings.port,
        # No unauthenticated read-only port: nothing needs it, and it would be one more shared port.
        "readOnlyPort": 0,
        "healthzBindAddress": "127.0.0.1",
        "healthzPort": settings.healthz_port,
        # A serving certificate from the cluster CA (IP SAN = node address), as a real node would get
        # from its CSR; the API server does not verify it today, but clients like the tests can.
        "tlsCertFile": str(settings.serving.cert),
        "tlsPrivateKeyFile": str(settings.serving.key),
        # Callers (the API server, with its kubelet client certificate) authenticate with certificates
        # from the cluster CA, and are authorised by the API server through SubjectAccessReviews
        # (Webhook), as on a production node; anonymous requests are refused.
        "authentication": {
            "x509": {"clientCAFile": str(settings.client_ca)},
            "webhook": {"enabled": False},
            "anonymous": {"enabled": False},
        },
        "authorization": {"mode": "Webhook"},
        "containerRuntimeEndpoint": f"unix://{settings.containerd_socket}",
        # Container logs of this node only (the default /var/log/pods would be shared by all nodes).
        "podLogsDir": str(settings.pod_logs_dir),
        # No systemd runs the test machines, so cgroups are managed as plain files; containerd's runc
        # is configured the same way (SystemdCgroup = false) and the two must agree.
        "cgroupDriver": "cgroupfs",
        # Each node keeps its pods under its own cgroup (created by node_host.py before the kubelet
        # starts: the kubelet refuses a cgroupRoot that does not exist), so two kubelets never
        # manage the same /kubepods tree, and removing a node removes its pods' cgroups.
        "cgroupRoot": settings.cgroup_root,
        "cgroupsPerQOS": True,
        # The CI machines run cgroup v1, which this kubelet refuses unless told otherwise (the
        # field defaults to true); cgroup v1 is deprecated, not removed.
        "failCgroupV1": False,
        # The machines have no swap, but the check should not decide whether a test bed starts.
        "failSwapOn": False,
        # The kubelet's iptables chains are for kube-proxy's benefit; there is no kube-proxy here,
        # and several kubelets would edit the same host tables.
        "makeIPTablesUtilChains": False,
        # The kubelet lowers its own oom_score_adj to -999 by default, which needs CAP_SYS_RESOURCE; the
        # test machines' root lacks it (see restrict_oom_score_adj in containerd_config.py).
        "oomScoreAdj": 0,
        # Images are imported, never pulled: a garbage collection would delete them for good.
        "imageGCHighThresholdPercent": 100,
        "imageGCLowThresholdPercent": 99,
        # All nodes share one disk with the CI job itself; the defaults (10% free) could evict test
        # pods on a busy runner for reasons no test is about.
        "evictionHard": {"memory.available": "100Mi", "nodefs.available": "1%", "imagefs.available": "1%"},
        # Status is recomputed every 5 s (default 10 s), so a starting node turns Ready sooner.
        "nodeStatusUpdateFrequency": "5s",
    }


def write_kubelet_configuration(settings: KubeletSettings, path: Path) -> Path:
    """Write the configuration as JSON (the kubelet reads YAML, of which JSON is a subset)."""
    path.write_text(json.dumps(kubelet_configuration(settings), indent=2) + "\n")
    return path


def kubelet_flags(settings: KubeletSettings, config: Path, kubeconfig: Path) -> list[str]:
    """The command-line flags that have no configuration-file field."""
    return [
        f"--config={config}",
        f"--kubeconfig={kubeconfig}",
        # Decides where the DRA plugin registry (plugins_registry/) and plugin folders (plugins/)
        # are, and the pods' volumes, checkpoints and DRA state: one folder per node.
        f"--root-dir={settings.root_dir}",
        # The node name (also the Hostname address the API server is told not to prefer).
        f"--hostname-override={settings.node_name}",
        f"--node-ip={settings.node_ip}",
        "--v=2",
    ]
