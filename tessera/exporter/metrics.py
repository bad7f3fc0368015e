"""The node daemon's own metrics: build info, the exporter's scrape count, duration and errors, and
what its bypass loop checked and did.

Kept apart from the collector (tessera/exporter/collector.py) so the names an operator alerts on when the
exporter itself misbehaves are defined, and started at zero, in one place. They live in a private
registry (never prometheus_client's global one) that the collector emits after its own families,
so a scrape's count and errors include that scrape, and tests and benchmarks can run several
daemons in one process without their series mixing.
"""

from __future__ import annotations

import platform
from importlib import metadata

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from tessera.exporter.bypass import REASONS

ERROR_SOURCES = ("claim", "limits", "region", "nvml")
"""Where a scrape can fail, part by part: a claim folder's identity file (or the daemon's record of
prepared claims), its limits file, its usage region, an NVML query. (A process's /proc entry that
is gone is a process that exited, not an error.) Every source is exported from the start (at
0), so ``rate()`` and alerts see a series before the first error."""

CHECK_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5)
"""Seconds: a check runs every 0.25 s by default, so one past 0.1 s is worth seeing."""

SCRAPE_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)
"""Seconds: the 50 ms target sits on a bucket boundary, so "p99 under 50 ms" reads off directly."""


def version() -> str:
    """The installed tessera package's version ("unknown" when run from an uninstalled tree)."""
    try:
        return metadata.version("tessera")
    except metadata.PackageNotFoundError:
        return "unknown"


class DaemonMetrics:
    """The daemon's own series, in ``self.registry``."""

    def __init__(self, node: str) -> None:
        self.registry = registry = CollectorRegistry(auto_describe=True)
        self.build_info = Gauge(
            "tessera_build_info",
            "Always 1: the tessera-driver version and Python version serving this node's metrics.",
            ["node", "version", "python_version"],
            registry=registry,
        )
        self.build_info.labels(node, version(), platform.python_version()).set(1)
        self.scrapes = Counter(
            "tessera_exporter_scrapes",
            "Scrapes of /metrics this exporter has answered (counted as each starts); tests use it to "
            "tell one scrape from the next.",
            ["node"],
            registry=registry,
        ).labels(node)
        self.duration = Histogram(
            "tessera_exporter_scrape_duration_seconds",
            "Time to collect the GPU and container series of one scrape, in seconds (observed when "
            "the collection ends, so it shows at the next scrape).",
            ["node"],
            buckets=SCRAPE_BUCKETS,
            registry=registry,
        ).labels(node)
        errors = Counter(
            "tessera_exporter_scrape_errors",
            "Parts of a scrape that failed and were left out, by source: claim (claim.json or the "
            "daemon's checkpoint), limits "
            "(limits file), region (usage region), nvml (a GPU query).",
            ["node", "source"],
            registry=registry,
        )
        self.errors = {source: errors.labels(node, source) for source in ERROR_SOURCES}
        self.nvml_hung = Gauge(
            "tessera_exporter_nvml_hung_gpus",
            "GPUs whose last NVML call has not returned within --nvml-timeout (a wedged driver): their "
            "NVML series are left out of each scrape until it returns, and /healthz fails once one has "
            "been hung for --nvml-restart-after seconds.",
            ["node"],
            registry=registry,
        ).labels(node)
        self.bypass_checks = Counter(
            "tessera_exporter_bypass_checks",
            "Checks the bypass loop has made (driver memory against each claim's usage region and "
            "limit), counted as each ends.",
            ["node"],
            registry=registry,
        ).labels(node)
        self.bypass_check_duration = Histogram(
            "tessera_exporter_bypass_check_duration_seconds",
            "Time one check of the bypass loop took, in seconds.",
            ["node"],
            buckets=CHECK_BUCKETS,
            registry=registry,
        ).labels(node)
        stopped = Counter(
            "tessera_exporter_bypass_stopped",
            "Processes the bypass loop stopped (SIGKILL), by reason: uncharged (driver memory past its "
            "own usage-region charge), over_limit (its claim's processes past the claim's limit).",
            ["node", "reason"],
            registry=registry,
        )
        self.bypass_stopped = {reason: stopped.labels(node, reason) for reason in REASONS}
        reported = Counter(
            "tessera_exporter_bypass_reported",
            "Episodes the bypass loop reported without stopping the process (--bypass-action=report, "
            "or a stop that failed), by reason as tessera_exporter_bypass_stopped_total.",
            ["node", "reason"],
            registry=registry,
        )
        self.bypass_reported = {reason: reported.labels(node, reason) for reason in REASONS}
