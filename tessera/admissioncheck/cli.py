"""``tessera-admission-check``: flags (each with an environment variable), start-up in order, a
health and metrics endpoint, and shutdown on SIGTERM after the decision in flight is written.

Run one replica: decisions are made in one process so that two Workloads never both count the same
free capacity (a second replica would need leader election, which this controller does not do).
"""

from __future__ import annotations

import argparse
import logging
import statistics
import sys
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path

from kubernetes import client
from prometheus_client import CollectorRegistry
from prometheus_client.core import CounterMetricFamily
from prometheus_client.metrics_core import Metric
from prometheus_client.registry import Collector

from tessera import command
from tessera.admissioncheck.controller import Stats, WorkloadController
from tessera.admissioncheck.fit import DEFAULT_BUDGET
from tessera.admissioncheck.inventory import Inventory
from tessera.command import Stoppable
from tessera.kube import api_client
from tessera.serving import Endpoints, HttpServer, registry_metrics
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
    command.log_flags(p, env)
    return p


class DecisionMetrics(Collector):
    """The controller's decisions as Prometheus families, read from its stats at each scrape: a
    counter by resulting state, and the median and 99th percentile of the recent decisions' times."""

    def __init__(self, stats: Callable[[], Stats]) -> None:
        self._stats = stats

    def collect(self) -> Iterable[Metric]:
        stats = self._stats()
        decisions = CounterMetricFamily(
            "tessera_admission_check_decisions", "Decisions made, by resulting state.", labels=["state"]
        )
        for state in ("ready", "pending", "rejected"):
            decisions.add_metric([state], getattr(stats, state))
        yield decisions
        durations = sorted(stats.durations)
        if durations:
            name = "tessera_admission_check_decision_seconds"
            summary = Metric(name, "Time to decide one Workload (recent decisions).", "summary")
            summary.add_sample(name, {"quantile": "0.5"}, statistics.median(durations))
            slowest = durations[min(len(durations) - 1, int(len(durations) * 0.99))]
            summary.add_sample(name, {"quantile": "0.99"}, slowest)
            yield summary


class AdmissionCheck(Stoppable):
    """The caches, the decision loop and the health and metrics endpoint: start, serve, stop."""

    def __init__(self, args: argparse.Namespace, api: client.ApiClient) -> None:
        self.fatal: str | None = None
        super().__init__()
        self._controller_name: str = args.controller_name
        # The watches call back only once started, when the controller exists.
        self.inventory = Inventory(api, args.controller_name, lambda what: self.controller.wake(what))
        self.controller = WorkloadController(api, self.inventory, FIELD_MANAGER, budget=args.search_budget)
        registry = CollectorRegistry()
        registry.register(DecisionMetrics(lambda: self.controller.stats))
        endpoints = Endpoints(
            healthz=lambda: (self.controller.alive(), "the decision loop is not running"),
            readyz=lambda: (self.inventory.synced(), "the caches have not had their first list yet"),
            metrics=registry_metrics(registry),
        )
        self._server = HttpServer("health", args.bind_address, args.health_port, endpoints)

    def start(self) -> None:
        self._server.start()
        self.inventory.start()
        log.info(
            "watching slices, claims, templates, pods, Workloads and AdmissionChecks; deciding %s",
            self._controller_name,
        )
        inventory = self.inventory
        if inventory.wait_synced(timeout=120) and not self._stop.is_set():
            log.info(
                "caches synced: %d GPUs on %d nodes",
                len(inventory.gpus),
                len({g.node for g in inventory.gpus}),
            )
        self.controller.start()

    def stop(self) -> None:
        """Finish the decision in flight, stop the watches and the endpoint."""
        self.controller.stop()
        self.inventory.stop()
        self._server.stop()
        log.info("stopped after %d decisions", self.controller.stats.decisions)


def main(argv: Sequence[str] | None = None) -> int:
    return command.main(parser(), lambda args: AdmissionCheck(args, api_client(args.kubeconfig)), log, argv)


if __name__ == "__main__":
    sys.exit(main())
