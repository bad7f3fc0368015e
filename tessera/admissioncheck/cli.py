"""``tessera-admission-check``: flags (each with an environment variable), start-up in order, a
health and metrics endpoint, and shutdown on SIGTERM after the decision in flight is written.

Run one replica: decisions are made in one process so that two Workloads never both count the same
free capacity (a second replica would need leader election, which this controller does not do).
"""

from __future__ import annotations

import argparse
import http.server
import logging
import signal
import statistics
import sys
import threading
from collections.abc import Callable, Sequence
from pathlib import Path
from types import FrameType

from tessera import logs
from tessera.admissioncheck.controller import WorkloadController
from tessera.admissioncheck.fit import DEFAULT_BUDGET
from tessera.admissioncheck.inventory import Inventory
from tessera.kube import api_client
from tessera.settings import setting

log = logging.getLogger("tessera.admissioncheck")

CONTROLLER_NAME = "tessera.dev/gpu-fit"
FIELD_MANAGER = "tessera-admission-check"


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="tessera-admission-check",
        description="Kueue AdmissionCheck controller: lets a Workload through only when all of its "
        "pods' GPU shares (memory and cores, per GPU, one node per pod) fit at once on the free "
        "capacity of the gpu.tessera.dev GPUs; otherwise leaves it Pending with a message that says "
        "why, and decides again when capacity changes. Every flag can also be set with the "
        "environment variable shown.",
    )
    env = "TESSERA_ADMISSION_CHECK_"
    setting(
        p,
        "--controller-name",
        env + "CONTROLLER_NAME",
        CONTROLLER_NAME,
        "spec.controllerName of the AdmissionChecks this controller decides",
    )
    setting(p, "--bind-address", env + "BIND_ADDRESS", "0.0.0.0", "address of /healthz, /readyz and /metrics")
    setting(
        p, "--health-port", env + "HEALTH_PORT", 8081, "plain HTTP port of /healthz, /readyz, /metrics", int
    )
    setting(
        p,
        "--search-budget",
        env + "SEARCH_BUDGET",
        DEFAULT_BUDGET,
        "share placements tried per decision before a packing search gives up",
        int,
    )
    p.add_argument(
        "--kubeconfig", type=Path, default=None, help="kubeconfig; default $KUBECONFIG, else in-cluster"
    )
    setting(p, "--log-level", env + "LOG_LEVEL", "info", "", choices=("debug", "info", "warning", "error"))
    setting(p, "--log-format", env + "LOG_FORMAT", "text", "", choices=("text", "json"))
    return p


def metrics_text(controller: WorkloadController) -> str:
    stats = controller.stats
    lines = [
        "# HELP tessera_admission_check_decisions_total Decisions made, by resulting state.",
        "# TYPE tessera_admission_check_decisions_total counter",
    ]
    for state in ("ready", "pending", "rejected"):
        lines.append(f'tessera_admission_check_decisions_total{{state="{state}"}} {getattr(stats, state)}')
    durations = sorted(stats.durations)
    if durations:
        lines += [
            "# HELP tessera_admission_check_decision_seconds Time to decide one Workload (recent decisions).",
            "# TYPE tessera_admission_check_decision_seconds summary",
            f'tessera_admission_check_decision_seconds{{quantile="0.5"}} {statistics.median(durations):.6f}',
            f'tessera_admission_check_decision_seconds{{quantile="0.99"}} '
            f"{durations[min(len(durations) - 1, int(len(durations) * 0.99))]:.6f}",
        ]
    return "\n".join(lines) + "\n"


def health_server(
    address: str, port: int, alive: Callable[[], bool], ready: Callable[[], bool], metrics: Callable[[], str]
) -> http.server.ThreadingHTTPServer:
    """/healthz: the decision loop and watches run; /readyz: every cache has had its first list."""

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            if self.path == "/healthz":
                ok, body = alive(), "ok\n"
            elif self.path == "/readyz":
                ok, body = ready(), "ok\n"
            elif self.path == "/metrics":
                ok, body = True, metrics()
            else:
                self.send_error(404)
                return
            data = (body if ok else "not ok\n").encode()
            self.send_response(200 if ok else 503)
            self.send_header("Content-Type", "text/plain; charset=utf-8")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, format: str, *args: object) -> None:
            return

    server = http.server.ThreadingHTTPServer((address, port), Handler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, name="health", daemon=True).start()
    return server


def main(argv: Sequence[str] | None = None) -> int:
    args = parser().parse_args(argv)
    logs.configure(args.log_level, args.log_format)
    api = api_client(args.kubeconfig)
    controller: WorkloadController | None = None

    def on_change(what: str) -> None:
        if controller is not None:
            controller.wake(what)

    inventory = Inventory(api, args.controller_name, on_change)
    controller = WorkloadController(api, inventory, FIELD_MANAGER, budget=args.search_budget)
    stop = threading.Event()

    def on_signal(signum: int, frame: FrameType | None) -> None:
        log.info("received %s; shutting down", signal.Signals(signum).name)
        stop.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    server = health_server(
        args.bind_address,
        args.health_port,
        alive=lambda: controller is not None and controller.alive(),
        ready=inventory.synced,
        metrics=lambda: metrics_text(controller) if controller else "",
    )
    inventory.start()
    log.info(
        "watching slices, claims, templates, pods, Workloads and AdmissionChecks; deciding %s",
        args.controller_name,
    )
    if inventory.wait_synced(timeout=120) and not stop.is_set():
        log.info(
            "caches synced: %d GPUs on %d nodes", len(inventory.gpus), len({g.node for g in inventory.gpus})
        )
    controller.start()
    stop.wait()
    controller.stop()
    inventory.stop()
    server.shutdown()
    log.info("stopped after %d decisions", controller.stats.decisions)
    return 0


if __name__ == "__main__":
    sys.exit(main())
