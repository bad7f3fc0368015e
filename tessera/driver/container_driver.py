"""How a container reaches the real driver: NVIDIA's toolkit CDI devices, or our own mounts.

The shim's aliases must point at ``libcuda.so.1`` and ``libnvidia-ml.so.1`` as the container sees
them, and the container needs the GPU's device nodes. On a node with NVIDIA Container Toolkit's CDI
spec, the toolkit's device for the GPU (``nvidia.com/gpu=<uuid>``) brings both, and we name it next
to ours. Elsewhere (a node without the toolkit, the simulated driver) the driver mounts the two
libraries from a host folder and adds the device nodes that exist on the host.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath

import yaml

from tessera.driver.claim_files import CONTAINER_DIR
from tessera.driver.config import DRIVER_LIBRARIES, DriverSource

log = logging.getLogger(__name__)

OWN_LIBRARY_DIR = CONTAINER_DIR / "driver"
"""Inside the claim's mount, which a tenant cannot rename: the shim's aliases point here, and a
renamed folder would leave the shim unloadable."""
_CONTROL_NODES = ("nvidiactl", "nvidia-uvm", "nvidia-uvm-tools")


MIG_MINORS = Path("/proc/driver/nvidia-caps/mig-minors")
_MIG_MINORS_MAX_BYTES = 1 << 20


def _mig_minors(path: Path) -> dict[str, int]:
    """The driver's capability name -> device minor table; bounded, and malformed lines skipped."""
    try:
        with path.open("rb") as table:
            text = table.read(_MIG_MINORS_MAX_BYTES).decode(errors="replace")
    except OSError as error:
        raise DriverSourceError(f"cannot read {path} to grant a MIG instance: {error.strerror}") from None
    out = {}
    for line in text.splitlines():
        name, _, number = line.strip().partition(" ")
        if number.strip().isdigit():
            out[name] = int(number)
    return out


class DriverSourceError(RuntimeError):
    """The driver libraries or device nodes cannot be provided; one sentence for the user."""


@dataclass(frozen=True)
class ContainerDriver:
    """The answer for one node, fixed at start-up."""

    toolkit_kind: str | None
    """NVIDIA toolkit's CDI kind to name per GPU, or None when we mount things ourselves."""
    libraries: dict[PurePosixPath, Path]
    """Container path -> host path of each driver library we mount (empty with the toolkit)."""
    container_cuda: PurePosixPath
    container_nvml: PurePosixPath
    common_device_nodes: tuple[Path, ...]
    device_dir: Path
    mig_minors: Path = MIG_MINORS
    """NVIDIA's table of MIG capability minors ("gpu0/gi1/ci0/access 13" lines)."""
    loader_libraries: dict[PurePosixPath, Path] = field(default_factory=dict)
    """Container path -> host path of the same libraries in the standard library folder, for a
    container without the shim (a MIG instance), whose programs find libcuda.so.1 only where the
    dynamic loader looks (empty with the toolkit, which mounts them there itself)."""

    def gpu_device_nodes(self, minor: int) -> tuple[Path, ...]:
        """The GPU's own node (/dev/nvidiaN), with our own edits. With no NVIDIA control node on
        the host there is no kernel driver (the simulated one) and no node to add; with one, a
        missing GPU node is an error, never a spec without it (nv#1380)."""
        if self.toolkit_kind is not None:
            return ()
        node = self.device_dir / f"nvidia{minor}"
        if node.exists():
            return (node,)
        if self.common_device_nodes:
            raise DriverSourceError(f"device node {node} is missing although the NVIDIA driver is loaded")
        return ()

    def mig_device_nodes(self, minor: int, gpu_instance: int, compute_instance: int) -> tuple[Path, ...]:
        """What a MIG instance needs with our own edits: its GPU's node and, with NVIDIA's kernel
        driver loaded, the two capability nodes that grant its GPU and compute instance
        (/dev/nvidia-caps/nvidia-capN, numbered as the driver's mig-minors table says). With the
        toolkit, its CDI device for the instance brings them."""
        gpu_nodes = self.gpu_device_nodes(minor)
        if self.toolkit_kind is not None or not self.common_device_nodes:
            return gpu_nodes
        wanted = (
            f"gpu{minor}/gi{gpu_instance}/access",
            f"gpu{minor}/gi{gpu_instance}/ci{compute_instance}/access",
        )
        minors = _mig_minors(self.mig_minors)
        missing = [w for w in wanted if w not in minors]
        if missing:
            raise DriverSourceError(
                f"{self.mig_minors} does not list {', '.join(missing)}: cannot grant MIG instance "
                f"{gpu_instance}/{compute_instance} of GPU {minor}"
            )
        return (*gpu_nodes, *(self.device_dir / "nvidia-caps" / f"nvidia-cap{minors[w]}" for w in wanted))

    def toolkit_ids(self, uuids: Sequence[str]) -> list[str]:
        return [f"{self.toolkit_kind}={u}" for u in uuids] if self.toolkit_kind else []


def resolve(source: DriverSource, cdi_dirs: Sequence[Path]) -> ContainerDriver:
    """Decide, once, how this node's containers get the driver."""
    use_toolkit = source.mode == "nvidia-toolkit" or (
        source.mode == "auto" and _toolkit_spec(cdi_dirs, source.toolkit_kind) is not None
    )
    if use_toolkit:
        library = PurePosixPath(source.toolkit_library_dir)
        log.info("containers get the driver from NVIDIA's CDI devices %s=<uuid>", source.toolkit_kind)
        return ContainerDriver(
            source.toolkit_kind,
            {},
            library / DRIVER_LIBRARIES[0],
            library / DRIVER_LIBRARIES[1],
            (),
            source.device_dir,
        )
    libraries: dict[PurePosixPath, Path] = {}
    for name in DRIVER_LIBRARIES:
        host = source.host_library_dir / name
        if not host.exists():
            raise DriverSourceError(
                f"{host} does not exist: set the driver library folder (--driver-library-dir) or use "
                "NVIDIA Container Toolkit's CDI spec"
            )
        libraries[OWN_LIBRARY_DIR / name] = host.resolve()
    nodes = tuple(source.device_dir / n for n in _CONTROL_NODES if (source.device_dir / n).exists())
    log.info(
        "containers get the driver from our own mounts of %s (device nodes: %s)",
        source.host_library_dir,
        ", ".join(map(str, nodes)) or "none: no NVIDIA kernel driver on this host",
    )
    standard = PurePosixPath(source.toolkit_library_dir)
    return ContainerDriver(
        None,
        libraries,
        OWN_LIBRARY_DIR / DRIVER_LIBRARIES[0],
        OWN_LIBRARY_DIR / DRIVER_LIBRARIES[1],
        nodes,
        source.device_dir,
        loader_libraries={standard / path.name: host for path, host in libraries.items()},
    )


def _toolkit_spec(cdi_dirs: Sequence[Path], kind: str) -> Path | None:
    """A CDI spec file in ``cdi_dirs`` that declares ``kind``."""
    for directory in cdi_dirs:
        if not directory.is_dir():
            continue
        for path in sorted(directory.iterdir()):
            if path.suffix not in (".json", ".yaml", ".yml"):
                continue
            try:
                text = path.read_text()
                document = json.loads(text) if path.suffix == ".json" else yaml.safe_load(text)
            except (OSError, ValueError, yaml.YAMLError):
                continue
            if isinstance(document, dict) and document.get("kind") == kind:
                return path
    return None
