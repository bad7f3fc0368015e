"""``tessera-driver``: the node daemon's command line. Every flag has an environment fallback, so a
DaemonSet can configure it either way."""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Sequence
from pathlib import Path

from tessera import command
from tessera.driver.config import DriverConfig, DriverSource
from tessera.driver.daemon import Daemon
from tessera.settings import repeated, setting, switch

log = logging.getLogger("tessera.driver")


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="tessera-driver",
        description=(
            "Tessera's node daemon: publishes each GPU's memory and compute as DRA consumable capacity "
            "and prepares the shares the scheduler allocates (kubelet DRA plugin)."
        ),
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    setting(p, "--node-name", "NODE_NAME", "", "this node's name")
    setting(p, "--kubeconfig", "KUBECONFIG", "", "kubeconfig; in-cluster credentials when empty")
    setting(
        p,
        "--kubelet-root",
        "TESSERA_KUBELET_ROOT",
        "/var/lib/kubelet",
        "the kubelet's root folder, holding plugins_registry/ and plugins/",
    )
    setting(
        p,
        "--cdi-dir",
        "TESSERA_CDI_DIR",
        "/var/run/cdi",
        "where claim CDI specs are written; the runtime must read it",
    )
    setting(p, "--state-dir", "TESSERA_STATE_DIR", "/var/lib/tessera", "claim folders and the checkpoint")
    setting(p, "--pod-uid", "POD_UID", "", "this pod's UID, for rolling-update socket names")
    setting(
        p,
        "--driver-source",
        "TESSERA_DRIVER_SOURCE",
        "auto",
        "how containers get device nodes and driver libraries: NVIDIA Container Toolkit's CDI devices, "
        "our own mounts, or auto (the toolkit when its CDI spec exists)",
        choices=("auto", "own", "nvidia-toolkit"),
    )
    setting(
        p,
        "--driver-library-dir",
        "TESSERA_DRIVER_LIBRARY_DIR",
        "/usr/lib/x86_64-linux-gnu",
        "host folder with libcuda.so.1 and libnvidia-ml.so.1",
    )
    setting(
        p,
        "--toolkit-library-dir",
        "TESSERA_TOOLKIT_LIBRARY_DIR",
        "/usr/lib/x86_64-linux-gnu",
        "where NVIDIA's toolkit mounts driver libraries in containers",
    )
    setting(p, "--device-dir", "TESSERA_DEVICE_DIR", "/dev", "where the NVIDIA device nodes are")
    repeated(
        p,
        "--container-env",
        "TESSERA_CONTAINER_ENV",
        "extra environment for prepared containers",
        "NAME=VALUE",
    )
    repeated(
        p,
        "--container-mount",
        "TESSERA_CONTAINER_MOUNTS",
        "extra host path mounted read-write at the same path in prepared containers",
        "PATH",
    )
    repeated(
        p,
        "--high-priority-namespace",
        "TESSERA_HIGH_PRIORITY_NAMESPACES",
        "namespace whose claims may ask ShareConfig priority 0 (high), which holds back low-priority "
        "neighbours on the GPU; a claim elsewhere asking it is refused at prepare",
        "NAMESPACE",
    )
    switch(
        p,
        "--watch-claims",
        "TESSERA_WATCH_CLAIMS",
        True,
        "cache this node's ResourceClaims from a cluster-wide watch (the API cannot select claims by node); "
        "off: one GET per prepared claim at each prepare and each clean-up sweep",
    )
    setting(
        p,
        "--boot-id-file",
        "TESSERA_BOOT_ID_FILE",
        "/proc/sys/kernel/random/boot_id",
        "the node's boot ID; claims are prepared again after it changes",
    )
    setting(
        p, "--health-interval", "TESSERA_HEALTH_INTERVAL", 2.0, "seconds between NVML health polls", float
    )
    setting(
        p,
        "--nvml-timeout",
        "TESSERA_NVML_TIMEOUT",
        10.0,
        "seconds a health poll's NVML calls may take before every GPU is tainted unmonitored and the "
        "daemon is not ready (a wedged driver)",
        float,
    )
    setting(
        p,
        "--cleanup-interval",
        "TESSERA_CLEANUP_INTERVAL",
        60.0,
        "seconds between sweeps that unprepare claims the API no longer has for this node",
        float,
    )
    setting(
        p,
        "--resync-interval",
        "TESSERA_RESYNC_INTERVAL",
        30.0,
        "seconds between full ResourceSlice checks (changes act at once)",
        float,
    )
    setting(
        p, "--health-port", "TESSERA_HEALTH_PORT", 0, "port for /healthz and /readyz; 0 turns them off", int
    )
    setting(p, "--health-address", "TESSERA_HEALTH_ADDRESS", "0.0.0.0", "address for the health endpoints")
    command.log_flags(p, "TESSERA_")
    command.api_flags(p, "TESSERA_")
    return p


def config_from(args: argparse.Namespace) -> DriverConfig:
    env = []
    for item in args.container_env:
        name, sep, value = item.partition("=")
        if not sep:
            raise ValueError(f"--container-env {item!r} is not NAME=VALUE")
        env.append((name, value))
    return DriverConfig(
        node_name=args.node_name,
        kubelet_root=Path(args.kubelet_root),
        cdi_dir=Path(args.cdi_dir),
        state_dir=Path(args.state_dir),
        pod_uid=args.pod_uid,
        source=DriverSource(
            mode=args.driver_source,
            host_library_dir=Path(args.driver_library_dir),
            toolkit_library_dir=Path(args.toolkit_library_dir),
            device_dir=Path(args.device_dir),
        ),
        container_env=tuple(env),
        container_mounts=tuple(Path(m) for m in args.container_mount),
        high_priority_namespaces=frozenset(args.high_priority_namespace),
        watch_claims=args.watch_claims,
        boot_id_file=Path(args.boot_id_file),
        health_interval=args.health_interval,
        nvml_timeout=args.nvml_timeout,
        cleanup_interval=args.cleanup_interval,
        resync_interval=args.resync_interval,
        health_port=args.health_port,
        health_address=args.health_address,
    )


def daemon(args: argparse.Namespace) -> Daemon:
    """The daemon the flags describe; flags that make no sense are a usage error."""
    try:
        config = config_from(args)
        config.validate()
    except ValueError as error:
        raise command.UsageError(error) from None
    return Daemon(config, command.api_client_from(args, Path(args.kubeconfig) if args.kubeconfig else None))


def main(argv: Sequence[str] | None = None) -> int:
    return command.main(parser(), daemon, log, argv)


if __name__ == "__main__":
    sys.exit(main())
