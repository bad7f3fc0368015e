"""The daemon's settings, frozen after start-up, and every path derived from them.

Paths are derived here once so that the registration socket, the DRA socket, the claim folders,
the CDI specs and the checkpoint are spelled in one place, and tests can point the whole daemon at
a test-bed node's folder by changing two roots.
"""

from __future__ import annotations

import base64
import hashlib
from dataclasses import dataclass, field
from pathlib import Path

from tessera.driver import checkpoint, claim_files
from tessera.names import DRIVER_NAME

UNIX_PATH_MAX = 107
"""sun_path holds 108 bytes including the terminating NUL."""

CDI_VENDOR = f"k8s.{DRIVER_NAME}"
CDI_CLASS = "claim"
CDI_KIND = f"{CDI_VENDOR}/{CDI_CLASS}"

DRIVER_LIBRARIES = ("libcuda.so.1", "libnvidia-ml.so.1")
"""What the shim's aliases point at, and what the driver's own CDI edits mount."""


@dataclass(frozen=True)
class DriverSource:
    """How a container gets the GPU's device nodes and driver libraries.

    ``nvidia-toolkit``: name NVIDIA Container Toolkit's CDI device for each GPU (``nvidia.com/gpu=<uuid>``)
    next to ours, and point the shim at the libraries where the toolkit mounts them.
    ``own``: mount ``host_library_dir``'s libraries and the GPU's device nodes ourselves (nodes
    without the toolkit, and the simulated driver).
    ``auto``: ``nvidia-toolkit`` when a toolkit spec for ``nvidia.com/gpu`` is in a CDI directory.
    """

    mode: str = "auto"
    host_library_dir: Path = Path("/usr/lib/x86_64-linux-gnu")
    toolkit_library_dir: Path = Path("/usr/lib/x86_64-linux-gnu")
    toolkit_kind: str = "nvidia.com/gpu"
    device_dir: Path = Path("/dev")


@dataclass(frozen=True)
class DriverConfig:
    node_name: str
    kubelet_root: Path = Path("/var/lib/kubelet")
    cdi_dir: Path = Path("/var/run/cdi")
    state_dir: Path = Path("/var/lib/tessera")
    driver_name: str = DRIVER_NAME
    pod_uid: str = ""
    """Set in a DaemonSet (downward API): socket names then carry it, so an old and a new pod of a
    rolling update can be registered at once."""
    source: DriverSource = field(default_factory=DriverSource)
    container_env: tuple[tuple[str, str], ...] = ()
    """Extra environment for every prepared container (the simulated driver's SIMGPU_CONFIG)."""
    container_mounts: tuple[Path, ...] = ()
    """Extra host paths bind-mounted read-write at the same path (the simulated driver's state)."""
    high_priority_namespaces: frozenset[str] = frozenset()
    """Namespaces whose claims may ask priority 0 (the chart's webhook.highPriorityNamespaces);
    a claim asking it elsewhere is refused at prepare (share_config.py)."""
    watch_claims: bool = True
    """Keep a watch-fed cache of ResourceClaims allocated here (prepare then rarely waits for the
    API); off, every prepare reads its claim with one GET and the daemon holds no cluster-wide watch,
    which very large clusters may prefer."""
    boot_id_file: Path = Path("/proc/sys/kernel/random/boot_id")
    health_interval: float = 2.0
    nvml_timeout: float = 10.0
    """Seconds a health poll's NVML calls may take before every GPU's health is taken as unknown."""
    cleanup_interval: float = 60.0
    resync_interval: float = 30.0
    health_port: int = 0
    """0: no HTTP health endpoint."""
    health_address: str = "127.0.0.1"

    @property
    def registry_dir(self) -> Path:
        return self.kubelet_root / "plugins_registry"

    @property
    def plugin_dir(self) -> Path:
        return self.kubelet_root / "plugins" / self.driver_name

    @property
    def registration_socket(self) -> Path:
        if not self.pod_uid:
            return self.registry_dir / f"{self.driver_name}-reg.sock"
        return _fit(
            self.registry_dir,
            f"{self.driver_name}-{self.pod_uid}-reg.sock",
            f"{self.driver_name}-{_short_hash(self.pod_uid, 8)}-reg.sock",
            f"dra-{_short_hash(self.driver_name + chr(0) + self.pod_uid, 16)}-reg.sock",
        )

    @property
    def dra_socket(self) -> Path:
        if not self.pod_uid:
            return self.plugin_dir / "dra.sock"
        return _fit(self.plugin_dir, f"dra-{self.pod_uid}.sock", f"dra-{_short_hash(self.pod_uid, 16)}.sock")

    @property
    def claims_dir(self) -> Path:
        return claim_files.in_state_dir(self.state_dir)

    @property
    def checkpoint_file(self) -> Path:
        return checkpoint.in_state_dir(self.state_dir)

    @property
    def pool_name(self) -> str:
        return self.node_name

    def validate(self) -> None:
        """Refuse settings that cannot work, before anything is created."""
        if not self.node_name:
            raise ValueError("the node name is required (--node-name or NODE_NAME)")
        if self.source.mode not in ("auto", "own", "nvidia-toolkit"):
            raise ValueError(f"driver source must be auto, own or nvidia-toolkit, not {self.source.mode!r}")
        for socket in (self.registration_socket, self.dra_socket):
            if len(str(socket).encode()) > UNIX_PATH_MAX:
                raise ValueError(
                    f"socket path {socket} is {len(str(socket).encode())} bytes; a Unix socket path "
                    f"holds at most {UNIX_PATH_MAX}: use a shorter kubelet root"
                )
        for key, _ in self.container_env:
            if not key or "=" in key:
                raise ValueError(f"container environment name {key!r} is not valid")
        if not self.nvml_timeout > 0:
            raise ValueError(f"the NVML timeout must be more than 0 seconds, not {self.nvml_timeout}")


def _short_hash(text: str, length: int) -> str:
    """The URL-safe base64 prefix of sha256(text), as the kubelet's Go helper names fallback sockets."""
    digest = base64.urlsafe_b64encode(hashlib.sha256(text.encode()).digest()).decode()
    return digest[:length]


def _fit(directory: Path, *names: str) -> Path:
    """The first of ``names`` whose full path fits a Unix socket address (else the last)."""
    for name in names:
        if len(str(directory / name).encode()) <= UNIX_PATH_MAX:
            return directory / name
    return directory / names[-1]
