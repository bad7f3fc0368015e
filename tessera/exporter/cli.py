"""``tessera-exporter``: the metrics exporter as a process of its own, beside the node daemon.

It runs apart from ``tessera-driver`` (in its own container of the DaemonSet's pod) so that nothing
in a scrape - a bug, a hostile claim's data, a slow NVML call - can stop or slow the kubelet plugin:
prepares go on whatever the exporter does, and each process holds only the privileges its own work
needs (docs/driver.md says what each container holds). It reads what the daemon writes and nothing
else: the claim folders and the checkpoint under the state folder (mounted read-only), NVML, each
GPU process's cgroup, and its own watch of the node's pods. Apart from scrapes, its bypass loop
(tessera/exporter/bypass_loop.py) stops a claim's processes that hold GPU memory around the shim
(``--bypass-action``) and writes an Event on their pod. Every flag has an environment fallback.
"""

from __future__ import annotations

import argparse
import logging
import sys
import threading
from collections.abc import Mapping, Sequence
from dataclasses import replace
from pathlib import Path

from kubernetes import client
from prometheus_client import CollectorRegistry

from tessera import command
from tessera.command import Stoppable
from tessera.driver import checkpoint, claim_files, devices
from tessera.driver.checkpoint import ClaimRecord
from tessera.driver.discovery import Nvml
from tessera.exporter.bypass_loop import ACTIONS, STOP, BypassLoop, BypassSettings
from tessera.exporter.collector import GpuCollector, Sources
from tessera.exporter.containers import ContainerIndex
from tessera.exporter.events import PodEvents
from tessera.exporter.metrics import DaemonMetrics
from tessera.exporter.server import MetricsServer
from tessera.exporter.watched_nvml import WatchedNvml, initialised
from tessera.names import METRICS_PORT
from tessera.quantity import quantity_to_int
from tessera.serving import Endpoints, HttpServer
from tessera.settings import setting

log = logging.getLogger("tessera.exporter")


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="tessera-exporter",
        description=(
            "Tessera's metrics exporter: per-container and per-GPU series for Prometheus at /metrics, "
            "read from the node daemon's claim folders, NVML and the node's pods."
        ),
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    setting(p, "--node-name", "NODE_NAME", "", "this node's name")
    setting(p, "--kubeconfig", "KUBECONFIG", "", "kubeconfig; in-cluster credentials when empty")
    setting(
        p,
        "--state-dir",
        "TESSERA_STATE_DIR",
        "/var/lib/tessera",
        "the node daemon's claim folders and checkpoint (only read)",
    )
    setting(
        p,
        "--metrics-port",
        "TESSERA_METRICS_PORT",
        METRICS_PORT,
        "port for Prometheus /metrics (per-container and per-GPU series)",
        int,
    )
    setting(p, "--metrics-address", "TESSERA_METRICS_ADDRESS", "0.0.0.0", "address for /metrics")
    setting(
        p,
        "--health-port",
        "TESSERA_HEALTH_PORT",
        0,
        "port for /healthz (serving /metrics) and /readyz (the node's pods listed); 0 turns them off",
        int,
    )
    setting(p, "--health-address", "TESSERA_HEALTH_ADDRESS", "0.0.0.0", "address for the health endpoints")
    setting(
        p,
        "--bypass-action",
        "TESSERA_BYPASS_ACTION",
        STOP,
        "what to do with a process that holds GPU memory around the shim past --bypass-tolerance for "
        "--bypass-bound seconds: stop (SIGKILL it) or report (only log and write an Event on its "
        "pod); either way once per episode (docs/metrics.md)",
        choices=ACTIONS,
    )
    setting(
        p,
        "--bypass-tolerance",
        "TESSERA_BYPASS_TOLERANCE",
        "512Mi",
        "per process, the driver memory past what the shim charged (or past its claim's limit) that "
        "is no bypass: the real driver's per-context overhead, which the shim does not charge (a "
        "quantity: bytes, or with Ki, Mi, Gi)",
        _tolerance,
    )
    setting(
        p,
        "--bypass-bound",
        "TESSERA_BYPASS_BOUND",
        2.0,
        "seconds a bypass must hold at every check before it is acted on (0-10)",
        float,
    )
    setting(
        p,
        "--bypass-period",
        "TESSERA_BYPASS_PERIOD",
        0.25,
        "seconds between two checks for a bypass (more than 0, less than 1)",
        float,
    )
    setting(
        p,
        "--nvml-timeout",
        "TESSERA_EXPORTER_NVML_TIMEOUT",
        2.0,
        "seconds an NVML call on one GPU may take; a GPU whose call has not returned is left out of "
        "scrapes and bypass checks (a wedged driver) until it does",
        float,
    )
    setting(
        p,
        "--nvml-restart-after",
        "TESSERA_EXPORTER_NVML_RESTART_AFTER",
        60.0,
        "seconds an NVML call may stay unreturned before /healthz fails, so that the kubelet restarts "
        "the exporter (NVML's initialisation or GPU count unreturned by then: the exporter exits 1)",
        float,
    )
    command.log_flags(p, "TESSERA_")
    command.api_flags(p, "TESSERA_")
    return p


def _tolerance(value: str) -> int:
    """A byte count as a Kubernetes quantity (512Mi); ValueError with one sentence otherwise."""
    return quantity_to_int(value)


class Exporter(Stoppable):
    """NVML, the pod watch, the collector and its HTTP servers: start, serve, stop."""

    def __init__(self, args: argparse.Namespace, kube: client.ApiClient) -> None:
        self._node: str = args.node_name
        self._claims_dir = claim_files.in_state_dir(Path(args.state_dir))
        self._checkpoint_file = checkpoint.in_state_dir(Path(args.state_dir))
        self._args = args
        self._kube = kube
        super().__init__()
        self.fatal: str | None = None
        self._nvml: Nvml | None = None
        self._server: MetricsServer | None = None
        self._health: HttpServer | None = None
        self._checks: threading.Thread | None = None

    def start(self) -> None:
        self._nvml = initialised(Nvml, self._args.nvml_restart_after)
        nvml = WatchedNvml(
            self._nvml, self._args.nvml_timeout, self._args.nvml_restart_after, devices.shareable
        )
        nvml.discover()
        index = ContainerIndex(client.CoreV1Api(self._kube).list_pod_for_all_namespaces, self._node)

        def watch() -> None:
            try:
                index.run(self._stop)
            except Exception as error:
                log.exception("the pod watch failed; stopping")
                self.fatal = f"pod watch: {error}"
                self._stop.set()

        threading.Thread(target=watch, name="pod-watch", daemon=True).start()

        sources = Sources(
            node=self._node,
            claims_dir=self._claims_dir,
            gpus=nvml.gpus,
            sample=nvml.sample,
            problems=nvml.problems,
            records=self._records,
            containers=index.containers,
            container=index.container,
        )
        metrics = DaemonMetrics(self._node)
        metrics.nvml_hung.set_function(nvml.hung)
        registry = CollectorRegistry()
        registry.register(GpuCollector(sources, metrics))
        events = PodEvents(client.CoreV1Api(self._kube).create_namespaced_event, self._node)
        settings = BypassSettings(
            self._args.bypass_action,
            self._args.bypass_tolerance,
            self._args.bypass_bound,
            self._args.bypass_period,
        )
        loop = BypassLoop(replace(sources, processes=nvml.compute_memory), settings, metrics, events.emit)
        # Checks start once the pods are listed: before that no process belongs to a claim.
        threading.Thread(target=events.run, args=(self._stop,), name="pod-events", daemon=True).start()
        self._checks = threading.Thread(target=self._bypass, args=(index, loop), name="bypass", daemon=True)
        self._checks.start()

        self._server = MetricsServer(self._args.metrics_address, self._args.metrics_port, registry)
        self._server.start()
        if self._args.health_port:
            endpoints = Endpoints(
                healthz=lambda: (
                    nvml.alive() if self.fatal is None else (False, "the pod watch failed; stopping")
                ),
                readyz=lambda: (index.synced.is_set(), "the node's pods are not listed yet"),
            )
            self._health = HttpServer("health", self._args.health_address, self._args.health_port, endpoints)
            self._health.start()

    def _bypass(self, index: ContainerIndex, loop: BypassLoop) -> None:
        while not index.synced.wait(1.0):
            if self._stop.is_set():
                return
        log.info(
            "checking for GPU memory taken around the shim every %g s (action %s, tolerance %d bytes per "
            "process, bound %g s)",
            self._args.bypass_period,
            self._args.bypass_action,
            self._args.bypass_tolerance,
            self._args.bypass_bound,
        )
        loop.run(self._stop)

    def _records(self) -> Mapping[str, ClaimRecord]:
        """The daemon's prepared claims, read from its checkpoint (never written or moved here: a
        file the daemon is replacing is read whole, as it renames a complete one into place)."""
        try:
            text = self._checkpoint_file.read_text()
        except FileNotFoundError:
            return {}
        return checkpoint.decode(text).claims

    def stop(self) -> None:
        """Stop serving, then close NVML (no scrape may reach a closed NVML). Safe to call twice."""
        self._stop.set()
        if self._health is not None:
            self._health.stop()
            self._health = None
        if self._server is not None:
            self._server.stop()
            self._server = None
        if self._checks is not None:  # a check in progress finishes before NVML closes
            self._checks.join(timeout=5)
            self._checks = None
        if self._nvml is not None:
            self._nvml.close()
            self._nvml = None


def exporter(args: argparse.Namespace) -> Exporter:
    """The exporter the flags describe; flags that make no sense are a usage error."""
    if not args.node_name:
        raise command.UsageError("the node name is required (--node-name or NODE_NAME)")
    if not 1 <= args.metrics_port <= 65535:
        raise command.UsageError(f"the metrics port must be 1-65535, not {args.metrics_port}")
    if not 0 <= args.health_port <= 65535:
        raise command.UsageError(f"the health port must be 0-65535, not {args.health_port}")
    if not args.nvml_timeout > 0:
        raise command.UsageError(f"the NVML timeout must be more than 0 seconds, not {args.nvml_timeout}")
    if not args.nvml_restart_after >= args.nvml_timeout:
        raise command.UsageError(
            f"--nvml-restart-after ({args.nvml_restart_after:g} s) must be at least --nvml-timeout "
            f"({args.nvml_timeout:g} s)"
        )
    if args.bypass_tolerance < 0:
        raise command.UsageError(f"the bypass tolerance must be 0 or more, not {args.bypass_tolerance}")
    if not 0 <= args.bypass_bound <= 10:
        raise command.UsageError(f"the bypass bound must be 0-10 seconds, not {args.bypass_bound}")
    if not 0 < args.bypass_period < 1:
        raise command.UsageError(
            f"the bypass period must be more than 0 and less than 1 second, not {args.bypass_period}"
        )
    return Exporter(args, command.api_client_from(args, Path(args.kubeconfig) if args.kubeconfig else None))


def main(argv: Sequence[str] | None = None) -> int:
    return command.main(parser(), exporter, log, argv)


if __name__ == "__main__":
    sys.exit(main())
