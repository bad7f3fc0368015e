"""``tessera-driver``: the node daemon's command line. Every flag has an environment fallback, so a
DaemonSet can configure it either way."""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
from collections.abc import Sequence
from pathlib import Path
from types import FrameType

from tessera import logs
from tessera.driver.config import DriverConfig, DriverSource
from tessera.driver.daemon import Daemon
from tessera.kube import api_client
from tessera.names import METRICS_PORT

log = logging.getLogger("tessera.driver")


def _env(name: str, default: str) -> str:
    return os.environ.get(name, default)


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="tessera-driver",
        description=(
            "Tessera's node daemon: publishes each GPU's memory and compute as DRA consumable capacity "
            "and prepares the shares the scheduler allocates (kubelet DRA plugin)."
        ),
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    p.add_argument("--node-name", default=_env("NODE_NAME", ""), help="this node's name [env NODE_NAME]")
    p.add_argument(
        "--kubeconfig",
        default=_env("KUBECONFIG", ""),
        help="kubeconfig; in-cluster credentials when empty [env KUBECONFIG]",
    )
    p.add_argument(
        "--kubelet-root",
        default=_env("TESSERA_KUBELET_ROOT", "/var/lib/kubelet"),
        help="the kubelet's root folder, holding plugins_registry/ and plugins/ [env TESSERA_KUBELET_ROOT]",
    )
    p.add_argument(
        "--cdi-dir",
        default=_env("TESSERA_CDI_DIR", "/var/run/cdi"),
        help="where claim CDI specs are written; the runtime must read it [env TESSERA_CDI_DIR]",
    )
    p.add_argument(
        "--state-dir",
        default=_env("TESSERA_STATE_DIR", "/var/lib/tessera"),
        help="claim folders and the checkpoint [env TESSERA_STATE_DIR]",
    )
    p.add_argument(
        "--pod-uid",
        default=_env("POD_UID", ""),
        help="this pod's UID, for rolling-update socket names [env POD_UID]",
    )
    p.add_argument(
        "--driver-source",
        choices=("auto", "own", "nvidia-toolkit"),
        default=_env("TESSERA_DRIVER_SOURCE", "auto"),
        help=(
            "how containers get device nodes and driver libraries: NVIDIA Container Toolkit's CDI devices, "
            "our own mounts, or auto (the toolkit when its CDI spec exists) [env TESSERA_DRIVER_SOURCE]"
        ),
    )
    p.add_argument(
        "--driver-library-dir",
        default=_env("TESSERA_DRIVER_LIBRARY_DIR", "/usr/lib/x86_64-linux-gnu"),
        help="host folder with libcuda.so.1 and libnvidia-ml.so.1 [env TESSERA_DRIVER_LIBRARY_DIR]",
    )
    p.add_argument(
        "--toolkit-library-dir",
        default=_env("TESSERA_TOOLKIT_LIBRARY_DIR", "/usr/lib/x86_64-linux-gnu"),
        help="where NVIDIA's toolkit mounts driver libraries in containers [env TESSERA_TOOLKIT_LIBRARY_DIR]",
    )
    p.add_argument(
        "--device-dir",
        default=_env("TESSERA_DEVICE_DIR", "/dev"),
        help="where the NVIDIA device nodes are [env TESSERA_DEVICE_DIR]",
    )
    p.add_argument(
        "--container-env",
        action="append",
        default=[e for e in _env("TESSERA_CONTAINER_ENV", "").split(",") if e],
        metavar="NAME=VALUE",
        help="extra environment for prepared containers; repeatable [env TESSERA_CONTAINER_ENV, a,b]",
    )
    p.add_argument(
        "--container-mount",
        action="append",
        default=[m for m in _env("TESSERA_CONTAINER_MOUNTS", "").split(",") if m],
        metavar="PATH",
        help=(
            "extra host path mounted read-write at the same path in prepared containers; repeatable "
            "[env TESSERA_CONTAINER_MOUNTS, a,b]"
        ),
    )
    p.add_argument(
        "--watch-claims",
        action=argparse.BooleanOptionalAction,
        default=_env("TESSERA_WATCH_CLAIMS", "true").lower() not in ("0", "false", "no"),
        help="cache allocated ResourceClaims from a cluster-wide watch; off: one GET per prepared claim "
        "[env TESSERA_WATCH_CLAIMS]",
    )
    p.add_argument(
        "--boot-id-file",
        default=_env("TESSERA_BOOT_ID_FILE", "/proc/sys/kernel/random/boot_id"),
        help="the node's boot ID; claims are prepared again after it changes [env TESSERA_BOOT_ID_FILE]",
    )
    p.add_argument(
        "--health-interval",
        type=float,
        default=float(_env("TESSERA_HEALTH_INTERVAL", "2")),
        help="seconds between NVML health polls [env TESSERA_HEALTH_INTERVAL]",
    )
    p.add_argument(
        "--cleanup-interval",
        type=float,
        default=float(_env("TESSERA_CLEANUP_INTERVAL", "60")),
        help="seconds between sweeps for prepared claims the API has not [env TESSERA_CLEANUP_INTERVAL]",
    )
    p.add_argument(
        "--resync-interval",
        type=float,
        default=float(_env("TESSERA_RESYNC_INTERVAL", "30")),
        help="seconds between full ResourceSlice checks (changes act at once) [env TESSERA_RESYNC_INTERVAL]",
    )
    p.add_argument(
        "--health-port",
        type=int,
        default=int(_env("TESSERA_HEALTH_PORT", "0")),
        help="port for /healthz and /readyz; 0 turns them off [env TESSERA_HEALTH_PORT]",
    )
    p.add_argument(
        "--health-address",
        default=_env("TESSERA_HEALTH_ADDRESS", "0.0.0.0"),
        help="address for the health endpoints [env TESSERA_HEALTH_ADDRESS]",
    )
    p.add_argument(
        "--metrics-port",
        type=int,
        default=int(_env("TESSERA_METRICS_PORT", str(METRICS_PORT))),
        help="port for Prometheus /metrics (per-container and per-GPU series); 0 turns the exporter off "
        "[env TESSERA_METRICS_PORT]",
    )
    p.add_argument(
        "--metrics-address",
        default=_env("TESSERA_METRICS_ADDRESS", "0.0.0.0"),
        help="address for /metrics [env TESSERA_METRICS_ADDRESS]",
    )
    p.add_argument(
        "--log-level",
        default=_env("TESSERA_LOG_LEVEL", "info"),
        choices=("debug", "info", "warning", "error"),
        help="[env TESSERA_LOG_LEVEL]",
    )
    p.add_argument(
        "--log-format",
        default=_env("TESSERA_LOG_FORMAT", "text"),
        choices=("text", "json"),
        help="[env TESSERA_LOG_FORMAT]",
    )
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
        watch_claims=args.watch_claims,
        boot_id_file=Path(args.boot_id_file),
        health_interval=args.health_interval,
        cleanup_interval=args.cleanup_interval,
        resync_interval=args.resync_interval,
        health_port=args.health_port,
        health_address=args.health_address,
        metrics_port=args.metrics_port,
        metrics_address=args.metrics_address,
    )


def main(argv: Sequence[str] | None = None) -> int:
    args = parser().parse_args(argv)
    logs.configure(args.log_level, args.log_format)
    try:
        config = config_from(args)
        config.validate()
    except ValueError as error:
        print(f"tessera-driver: {error}", file=sys.stderr)
        return 2
    daemon = Daemon(config, api_client(Path(args.kubeconfig) if args.kubeconfig else None))

    def on_signal(signum: int, frame: FrameType | None) -> None:
        log.info("received %s; shutting down", signal.Signals(signum).name)
        daemon.request_stop()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    try:
        daemon.start()
        daemon.wait()
    except Exception as error:
        log.exception("cannot run: %s", error)
        daemon.fatal = str(error)
    finally:
        daemon.stop()
    if daemon.fatal:
        log.error("stopped because %s", daemon.fatal)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
