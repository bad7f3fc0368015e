"""``tessera-admission-check``: flags (each with an environment variable), start-up in order, a
health and metrics endpoint, and shutdown on SIGTERM after the decision in flight is written.

Decisions are made in one process so that two Workloads never both count the same free capacity:
every replica runs its watches (warm caches, ready to take over), but only the holder of a Lease
(tessera/leader_election.py) runs the decision loop. A leader that loses the lease stops deciding at
once and exits with status 1, to come back as a standby, as client-go's controllers do.
"""

from __future__ import annotations

import argparse
import logging
import statistics
import sys
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path

from kubernetes import client
from prometheus_client import CollectorRegistry, Gauge
from prometheus_client.core import CounterMetricFamily
from prometheus_client.metrics_core import Metric
from prometheus_client.registry import Collector

from tessera import command
from tessera.admissioncheck.controller import Stats, WorkloadController
from tessera.admissioncheck.fit import DEFAULT_BUDGET
from tessera.admissioncheck.inventory import Inventory
from tessera.command import Stoppable, UsageError
from tessera.leader_election import LEASE_DURATION, RENEW_DEADLINE, RETRY_PERIOD, LeaderElector, identity
from tessera.serving import Endpoints, HttpServer, registry_metrics
from tessera.settings import seconds, setting, switch

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
        "--probe-port",
        env + "PROBE_PORT",
        8082,
        "plain HTTP port of /healthz and /readyz alone, for the kubelet's probes; -1 turns it off",
        int,
    )
    setting(
        p,
        "--search-budget",
        env + "SEARCH_BUDGET",
        DEFAULT_BUDGET,
        "share placements tried per decision before a packing search gives up",
        int,
    )
    switch(
        p,
        "--leader-elect",
        env + "LEADER_ELECT",
        True,
        "decide only while holding the Lease, so that replicas can run side by side (off: this "
        "process must be the only one)",
    )
    setting(
        p,
        "--leader-election-namespace",
        "POD_NAMESPACE",
        "",
        "namespace of the Lease (the chart sets POD_NAMESPACE to the pod's own)",
    )
    setting(
        p,
        "--leader-election-id",
        env + "LEADER_ELECTION_ID",
        FIELD_MANAGER,
        "name of the Lease the replicas hold in turn",
    )
    setting(
        p,
        "--leader-election-lease-duration",
        env + "LEADER_ELECTION_LEASE_DURATION",
        LEASE_DURATION,
        "seconds a standby waits, after it last saw the Lease renewed, before taking it over: how long "
        "Workloads wait undecided after the leader dies without releasing it",
        seconds,
    )
    setting(
        p,
        "--leader-election-renew-deadline",
        env + "LEADER_ELECTION_RENEW_DEADLINE",
        RENEW_DEADLINE,
        "seconds the leader may go without renewing the Lease before it stops deciding; less than the "
        "lease duration",
        seconds,
    )
    setting(
        p,
        "--leader-election-retry-period",
        env + "LEADER_ELECTION_RETRY_PERIOD",
        RETRY_PERIOD,
        "seconds between attempts to take or renew the Lease; less than the renew deadline",
        seconds,
    )
    p.add_argument(
        "--kubeconfig", type=Path, default=None, help="kubeconfig; default $KUBECONFIG, else in-cluster"
    )
    command.log_flags(p, env)
    command.api_flags(p, env)
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
    """The caches, the election, the decision loop and the health and metrics endpoint: start,
    serve, stop."""

    def __init__(self, args: argparse.Namespace, api: client.ApiClient) -> None:
        self.fatal: str | None = None
        super().__init__()
        self._controller_name: str = args.controller_name
        # The watches call back only once started, when the controller exists.
        self.inventory = Inventory(api, args.controller_name, lambda what: self.controller.wake(what))
        self.controller = WorkloadController(api, self.inventory, FIELD_MANAGER, budget=args.search_budget)
        self.elector: LeaderElector | None = None
        if args.leader_elect:
            if not args.leader_election_namespace:
                raise UsageError("--leader-elect needs --leader-election-namespace (or $POD_NAMESPACE)")
            try:
                self.elector = LeaderElector(
                    api,
                    args.leader_election_namespace,
                    args.leader_election_id,
                    identity(),
                    on_started=self.controller.start,
                    on_lost=self._lost,
                    lease_duration=args.leader_election_lease_duration,
                    renew_deadline=args.leader_election_renew_deadline,
                    retry_period=args.leader_election_retry_period,
                )
            except ValueError as error:
                raise UsageError(
                    f"{error} (--leader-election-retry-period, --leader-election-renew-deadline, "
                    "--leader-election-lease-duration)"
                ) from None
        registry = CollectorRegistry()
        registry.register(DecisionMetrics(lambda: self.controller.stats))
        Gauge(
            "tessera_admission_check_leader",
            "1 while this replica holds the Lease and decides, 0 on a standby.",
            registry=registry,
        ).set_function(lambda: float(self.deciding()))
        endpoints = Endpoints(
            healthz=lambda: (self.healthy(), "the decision loop or the leader election is not running"),
            readyz=lambda: (self.inventory.synced(), "the caches have not had their first list yet"),
            metrics=registry_metrics(registry),
        )
        self._servers = [HttpServer("health", args.bind_address, args.health_port, endpoints)]
        if args.probe_port >= 0:  # a port no scraper shares, so probes never wait behind /metrics
            self._servers.append(HttpServer("probes", args.bind_address, args.probe_port, endpoints.probes()))

    def deciding(self) -> bool:
        """Whether this replica runs the decision loop: the leader, or the only replica."""
        return self.controller.alive() if self.elector is None else self.elector.leading

    def healthy(self) -> bool:
        """The leader's decision loop runs; a standby's election runs."""
        if self.elector is None or self.elector.leading:
            return self.controller.alive()
        return self.elector.alive()

    def _lost(self, why: str) -> None:
        """Stop deciding at once (the decision in flight is written), then end the process."""
        self.controller.stop()
        self.fatal = f"this replica lost the leadership ({why}); it restarts as a standby"
        self._stop.set()

    def start(self) -> None:
        for server in self._servers:
            server.start()
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
        if self.elector is None:
            self.controller.start()
        elif not self._stop.is_set():
            log.info(
                "campaigning for lease %s/%s as %s; deciding only while holding it",
                self.elector.namespace,
                self.elector.name,
                self.elector.holder,
            )
            self.elector.start()

    def stop(self) -> None:
        """Finish the decision in flight, release the lease (only once no decision can be in
        flight: a standby must never decide beside us), stop the watches and the endpoint."""
        self.controller.stop()
        if self.elector is not None:
            self.elector.stop(release=not self.controller.alive())
        self.inventory.stop()
        for server in self._servers:
            server.stop()
        log.info("stopped after %d decisions", self.controller.stats.decisions)


def main(argv: Sequence[str] | None = None) -> int:
    return command.main(
        parser(), lambda args: AdmissionCheck(args, command.api_client_from(args, args.kubeconfig)), log, argv
    )


if __name__ == "__main__":
    sys.exit(main())
