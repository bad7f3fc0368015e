"""The collector run at each scrape: claims' usage regions and NVML, turned into per-container and
per-GPU series.

Usage is read at scrape time, never cached: a number on the dashboard is what the limit saw at that
instant. Only what cannot change is kept between scrapes: a claim's identity and limits (written
once at prepare from an allocation that never changes) and the watch-fed pod index.

Nothing a tenant writes is trusted or mapped. A claim's usage region is world-writable and mounted
into its containers, so it is read as a private copy (``tessera.shim.format.read_region``: pread,
checked header, size and counts, never a write); a malformed one is that claim's bad data, counted
and logged, and costs no other claim anything. Dead processes' slots are skipped, not swept: the
shim sweeps its own region.

Processes are tied to containers by what the kernel says: NVML lists each process with a context on
a GPU and the memory the driver holds for it; the process's cgroup names its pod and container
(tessera/exporter/cgroups.py), and the pod index maps that to the container and its claims. So the memory the
driver reports for a container's processes stands next to what the shim charged its claim, and
memory no claim accounts for - a process in no Tessera container, or a claim's processes holding
more than its limit, as one that opened the real driver library around the shim does - is exported
per GPU and named in the log. Compute utilisation comes from NVML's per-process samples of the
claim's processes; where the driver gives no per-process samples, from the GPU time the shim
charged the claim between two scrapes.

A failure in one claim or one GPU drops that part's series and counts an error by source; it never
fails the scrape. A GPU whose NVML call hangs is one such failure: the exporter calls NVML under a
watchdog (tessera/exporter/watched_nvml.py), so the scrape goes on without that GPU's NVML series.
Concurrent scrapes collect one at a time (they share the caches above).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from tessera.driver.checkpoint import ClaimRecord
from tessera.driver.devices import device_name
from tessera.driver.discovery import Gpu, GpuSample
from tessera.exporter import reading
from tessera.exporter.containers import ContainerRef
from tessera.exporter.metrics import DaemonMetrics
from tessera.exporter.reading import Claim, ClaimReader
from tessera.shim import format as shim_format
from tessera.watchdog import Hung

log = logging.getLogger(__name__)

CONTAINER_LABELS = ("namespace", "pod", "container", "claim", "node", "device_uuid", "device_index")
GPU_LABELS = ("node", "device_uuid", "device_index", "model")

# Per container and GPU.
CONTAINER_MEMORY_USED = "tessera_container_gpu_memory_used_bytes"
CONTAINER_MEMORY_LIMIT = "tessera_container_gpu_memory_limit_bytes"
CONTAINER_MEMORY_DRIVER = "tessera_container_gpu_memory_driver_bytes"
CONTAINER_MEMORY_EXCESS = "tessera_container_gpu_memory_excess_bytes"
CONTAINER_COMPUTE_LIMIT = "tessera_container_gpu_compute_limit_ratio"
CONTAINER_UTILIZATION = "tessera_container_gpu_utilization_ratio"
CONTAINER_UTILIZATION_EXCESS = "tessera_container_gpu_utilization_excess_ratio"
CONTAINER_PROCESSES = "tessera_container_gpu_processes"
# Per GPU.
GPU_MEMORY_TOTAL = "tessera_gpu_memory_total_bytes"
GPU_MEMORY_USED = "tessera_gpu_memory_used_bytes"
GPU_MEMORY_UNACCOUNTED = "tessera_gpu_memory_unaccounted_bytes"
GPU_PROCESSES = "tessera_gpu_processes"
GPU_UTILIZATION = "tessera_gpu_utilization_ratio"
GPU_TEMPERATURE = "tessera_gpu_temperature_celsius"
GPU_POWER = "tessera_gpu_power_watts"
GPU_HEALTHY = "tessera_gpu_healthy"
GPU_MEMORY_ALLOCATED = "tessera_gpu_memory_allocated_bytes"
GPU_COMPUTE_ALLOCATED = "tessera_gpu_compute_allocated_ratio"
GPU_SHARES = "tessera_gpu_shares"

_HELP = {
    CONTAINER_MEMORY_USED: "Device memory held by the container's claim on this GPU, in bytes, read from the "
    "claim's usage region (what the shim's memory limit counts; processes that have died left "
    "out). Containers that share one claim share this figure.",
    CONTAINER_MEMORY_LIMIT: "The claim's memory limit on this GPU, in bytes, from its limits file (the sum "
    "of its shares' consumed memory); the GPU's total memory when the claim has no memory limit.",
    CONTAINER_MEMORY_DRIVER: "Device memory the driver reports for the container's processes on this GPU, "
    "in bytes (NVML's per-process used memory, processes matched to the container by their "
    "cgroup), whether or not they went through the shim.",
    CONTAINER_MEMORY_EXCESS: "Device memory the driver reports for the claim's processes (every container "
    "using the claim) on this GPU beyond the claim's memory limit, in bytes; 0 within the limit. "
    "Above 0: memory taken around the shim, or the real driver's per-context overhead.",
    CONTAINER_COMPUTE_LIMIT: "The claim's compute cap on this GPU as a ratio 0-1 of the GPU's time, from its "
    "limits file; 1 when uncapped.",
    CONTAINER_UTILIZATION: "Share of this GPU's time, 0-1, that the claim's processes kept its SMs busy "
    "over NVML's last sample window (NVML per-process samples of the processes of the containers "
    "using the claim, matched by cgroup); from the GPU time the shim charged between two scrapes "
    "where NVML gives no samples.",
    CONTAINER_UTILIZATION_EXCESS: "Share of this GPU's time, 0-1, by which the claim's processes kept its "
    "SMs busy past the claim's compute cap over NVML's last sample window, by the driver's own "
    "per-process samples (compute taken around the shim, which caps only the launches it sees); 0 "
    "within the cap. Only where NVML gives per-process samples.",
    CONTAINER_PROCESSES: "Live processes of the containers using the claim with a compute context on this "
    "GPU (NVML's list, matched to containers by cgroup); where NVML gives no list, the claim's "
    "processes holding memory on it in its usage region.",
    GPU_MEMORY_TOTAL: "Total device memory of the GPU, in bytes, from NVML.",
    GPU_MEMORY_USED: "Device memory in use on the GPU by every process, in bytes, from NVML.",
    GPU_MEMORY_UNACCOUNTED: "Device memory on the GPU that no claim prepared on this node accounts for, in "
    "bytes: what the driver reports for processes in no container using a claim on this GPU, plus "
    "each claim's processes' memory beyond its limit.",
    GPU_PROCESSES: "Processes with a compute context on the GPU, from NVML (each holds the driver's "
    "per-context overhead on a real GPU).",
    GPU_UTILIZATION: "Share of time, 0-1, that one or more kernels ran on the GPU over NVML's sample window.",
    GPU_TEMPERATURE: "GPU core temperature in degrees Celsius, from NVML.",
    GPU_POWER: "GPU power draw in watts, from NVML.",
    GPU_HEALTHY: "1 while the GPU answers NVML and is published for new shares, 0 while it is lost or "
    "failing (tainted gpu.tessera.dev/unhealthy).",
    GPU_MEMORY_ALLOCATED: "Device memory the claims prepared on this node reserve on the GPU, in bytes: "
    "their consumedCapacity memory, summed.",
    GPU_COMPUTE_ALLOCATED: "Compute the claims prepared on this node reserve on the GPU as a ratio 0-1: "
    "their consumedCapacity cores, summed, over 100.",
    GPU_SHARES: "Shares of the GPU held by claims prepared on this node (one per allocated device result).",
}

FAMILIES = tuple(_HELP)
"""Every GPU and container family the collector produces (the daemon's own are in metrics.py)."""


@dataclass(frozen=True)
class Sources:
    """Where the collector reads from; the exporter passes its live parts, tests pass their own."""

    node: str
    claims_dir: Path
    gpus: Callable[[], Sequence[Gpu]]
    """The GPUs to report, asked at each scrape: a GPU whose NVML hung at start joins once it answers."""
    sample: Callable[[str], GpuSample]
    """NVML figures for a GPU UUID (raises when the GPU cannot be read at all)."""
    problems: Callable[[], Mapping[str, object]]
    """GPU UUID -> problem, for GPUs that are unhealthy now."""
    records: Callable[[], Mapping[str, ClaimRecord]]
    """The prepared claims (shares per GPU come from their devices); OSError or ValueError when
    they cannot be read."""
    containers: Callable[[str, str], Sequence[ContainerRef]]
    """(namespace, claim name) -> the running containers that use it."""
    container: Callable[[str, str], ContainerRef | None]
    """(pod UID, runtime container ID) -> that container, from the pods' statuses."""
    proc: Path = Path("/proc")
    clock: Callable[[], float] = field(default=time.monotonic)
    processes: Callable[[str], Mapping[int, int | None] | None] | None = None
    """NVML's process list of a GPU UUID alone (``GpuSample.compute_memory``), for the bypass loop's
    frequent checks; None: taken from ``sample``."""


class GpuCollector(Collector):
    """A prometheus_client collector: ``collect()`` reads everything afresh at each scrape."""

    def __init__(self, sources: Sources, metrics: DaemonMetrics) -> None:
        self._s = sources
        self._metrics = metrics
        self._reader = ClaimReader(sources.claims_dir, self._error)
        self._charged: dict[tuple[str, str], tuple[int, float]] = {}
        """(claim UID, GPU UUID) -> (charged ns, when): the fallback utilisation's last reading."""
        self._over: set[tuple[str, str]] = set()
        """(claim UID, GPU UUID) whose processes hold more than the claim's limit at the last
        scrape: logged when it starts and when it ends, not at every scrape."""
        self._outside: dict[str, set[int]] = {}
        """GPU UUID -> pids holding memory there that no claim accounts for, at the last scrape."""
        self._collecting = threading.Lock()
        """Held through one collection: concurrent scrapes share the reader's cache and the last
        scrape's readings above, so they collect one at a time."""

    def describe(self) -> Iterable[Metric]:
        """Families without samples: registering must not run a whole collection."""
        own = list(self._metrics.registry.collect())
        return [*(GaugeMetricFamily(name, help_text) for name, help_text in _HELP.items()), *own]

    def collect(self) -> Iterator[Metric]:
        self._metrics.scrapes.inc()
        started = time.perf_counter()
        try:
            with self._collecting:
                families = self._collect()
            yield from families
            yield from self._metrics.registry.collect()  # last: this scrape's count and errors
        finally:
            self._metrics.duration.observe(time.perf_counter() - started)

    # ------------------------------------------------------------------ reading

    def _collect(self) -> list[Metric]:
        claims = self._reader.claims()
        gpus = list(self._s.gpus())
        samples = self._samples(gpus)
        families = {
            name: GaugeMetricFamily(
                name,
                _HELP[name],
                labels=CONTAINER_LABELS if name.startswith("tessera_container") else GPU_LABELS,
            )
            for name in _HELP
        }
        self._gpu_series(families, gpus, claims, samples)
        self._container_series(families, gpus, claims, samples)
        return list(families.values())

    def _samples(self, gpus: Sequence[Gpu]) -> dict[str, GpuSample]:
        out = {}
        for gpu in gpus:
            try:
                out[gpu.uuid] = self._s.sample(gpu.uuid)
            except Hung:  # a wedged driver: counted at each scrape, logged once where it is called
                self._metrics.errors["nvml"].inc()
            except Exception as error:  # a lost GPU: its NVML series go, the rest stay
                self._error("nvml", "GPU %s: %s", gpu.uuid, error)
        return out

    def _error(self, source: str, message: str, *args: object) -> None:
        self._metrics.errors[source].inc()
        log.warning("metrics: " + message, *args)

    # ------------------------------------------------------------------ per GPU

    def _gpu_series(
        self,
        families: dict[str, GaugeMetricFamily],
        gpus: Sequence[Gpu],
        claims: list[Claim],
        samples: Mapping[str, GpuSample],
    ) -> None:
        problems = self._s.problems()
        memory: dict[str, int] = {}
        cores: dict[str, int] = {}
        for claim in claims:
            for limit in claim.limits:
                memory[limit.uuid] = memory.get(limit.uuid, 0) + (limit.memory_bytes or 0)
                cores[limit.uuid] = cores.get(limit.uuid, 0) + limit.cores
        shares: dict[str, int] | None = None
        by_name = {device_name(g): g.uuid for g in gpus}
        try:
            records = self._s.records()
        except (OSError, ValueError) as error:  # the checkpoint unreadable: shares unknown
            self._error("claim", "prepared claims: %s", error)
        else:
            shares = {}
            for record in records.values():
                for device in record.devices:
                    uuid = by_name.get(device.device)
                    if uuid is not None:
                        shares[uuid] = shares.get(uuid, 0) + 1
        for gpu in gpus:
            labels = [self._s.node, gpu.uuid, str(gpu.index), gpu.product_name]
            families[GPU_HEALTHY].add_metric(labels, 0.0 if gpu.uuid in problems else 1.0)
            families[GPU_MEMORY_ALLOCATED].add_metric(labels, float(memory.get(gpu.uuid, 0)))
            families[GPU_COMPUTE_ALLOCATED].add_metric(labels, cores.get(gpu.uuid, 0) / 100)
            if shares is not None:
                families[GPU_SHARES].add_metric(labels, float(shares.get(gpu.uuid, 0)))
            sample = samples.get(gpu.uuid)
            if sample is None:
                continue
            for name, value, scale in (
                (GPU_MEMORY_TOTAL, sample.memory_total_bytes, 1.0),
                (GPU_MEMORY_USED, sample.memory_used_bytes, 1.0),
                (GPU_UTILIZATION, sample.utilization_percent, 0.01),
                (GPU_TEMPERATURE, sample.temperature_celsius, 1.0),
                (GPU_POWER, sample.power_milliwatts, 0.001),
            ):
                if value is not None:
                    families[name].add_metric(labels, value * scale)
            if sample.compute_memory is not None:
                families[GPU_PROCESSES].add_metric(labels, float(len(sample.compute_memory)))

    # ------------------------------------------------------------------ per container

    def _container_series(
        self,
        families: dict[str, GaugeMetricFamily],
        gpus: Sequence[Gpu],
        claims: list[Claim],
        samples: Mapping[str, GpuSample],
    ) -> None:
        by_uuid = {g.uuid: g for g in gpus}
        owners = {
            pid: placed.ref
            for pid, placed in reading.owners(self._s.proc, _pids(samples), self._s.container).items()
        }
        now = self._s.clock()
        seen: set[tuple[str, str]] = set()
        over: set[tuple[str, str]] = set()
        excess_on: dict[str, int] = {}  # GPU UUID -> claims' memory past their limits there
        accounted: dict[str, set[int]] = {}  # GPU UUID -> pids of containers with a claim on it
        unknown: set[str] = set()  # GPUs where a claim's excess is unknown (a figure not given)
        users = {claim.uid: self._s.containers(claim.namespace, claim.name) for claim in claims}
        for claim in claims:
            containers = users[claim.uid]
            for limit in claim.limits:
                gpu = by_uuid.get(limit.uuid)
                if gpu is None:
                    continue
                seen.add((claim.uid, limit.uuid))
                sample = samples.get(limit.uuid)
                listed = sample.compute_memory if sample is not None else None
                ours = {pid for pid, ref in owners.items() if ref in containers}
                on_gpu = {pid: used for pid, used in (listed or {}).items() if pid in ours}
                accounted.setdefault(limit.uuid, set()).update(on_gpu)
                usage = {g.uuid: g for g in claim.region.gpus}.get(limit.uuid) if claim.region else None
                utilization, sampled = self._utilization(claim.uid, limit.uuid, usage, ours, sample, now)
                # Every process holding memory on a GPU has a context there: NVML's list is the
                # whole set where it is given; the region's slots holding memory where it is not.
                if listed is not None:
                    count: int | None = len(on_gpu)
                elif claim.region is not None:
                    count = sum(1 for p in claim.region.processes if p.used_bytes.get(limit.uuid, 0) > 0)
                else:
                    count = None
                memory_limit = limit.memory_bytes if limit.memory_bytes is not None else gpu.memory_bytes
                compute_limit = 1.0 if limit.cores in (0, 100) else limit.cores / 100
                known = listed is not None and all(v is not None for v in on_gpu.values())
                driver_total = sum(v or 0 for v in on_gpu.values())
                excess = max(0, driver_total - memory_limit) if known else None
                if listed is not None and excess is None:
                    unknown.add(limit.uuid)
                if excess:
                    excess_on[limit.uuid] = excess_on.get(limit.uuid, 0) + excess
                    over.add((claim.uid, limit.uuid))
                    self._report_over(claim, limit.uuid, containers, driver_total, memory_limit)
                for ref in containers:
                    labels = [
                        ref.namespace,
                        ref.pod,
                        ref.container,
                        claim.name,
                        self._s.node,
                        gpu.uuid,
                        str(gpu.index),
                    ]
                    if claim.region is not None:
                        families[CONTAINER_MEMORY_USED].add_metric(
                            labels, float(usage.used_bytes if usage else 0)
                        )
                    families[CONTAINER_MEMORY_LIMIT].add_metric(labels, float(memory_limit))
                    families[CONTAINER_COMPUTE_LIMIT].add_metric(labels, compute_limit)
                    if count is not None:
                        families[CONTAINER_PROCESSES].add_metric(labels, float(count))
                    if utilization is not None:
                        families[CONTAINER_UTILIZATION].add_metric(labels, utilization)
                        if sampled:
                            excess_ratio = max(0.0, utilization - compute_limit)
                            families[CONTAINER_UTILIZATION_EXCESS].add_metric(labels, excess_ratio)
                    mine = [on_gpu[pid] for pid in on_gpu if owners[pid] == ref]
                    if listed is not None and None not in mine:
                        families[CONTAINER_MEMORY_DRIVER].add_metric(labels, float(sum(v or 0 for v in mine)))
                    if excess is not None:
                        families[CONTAINER_MEMORY_EXCESS].add_metric(labels, float(excess))
        for gpu in gpus:
            sample = samples.get(gpu.uuid)
            if sample is None or sample.compute_memory is None:
                continue
            outside = [
                used
                for pid, used in sample.compute_memory.items()
                if pid not in accounted.get(gpu.uuid, set())
            ]
            if None in outside or gpu.uuid in unknown:
                continue  # the driver does not say how much: unknown, not 0
            self._report_outside(gpu, sample.compute_memory, accounted.get(gpu.uuid, set()), owners)
            total = excess_on.get(gpu.uuid, 0) + sum(v or 0 for v in outside)
            labels = [self._s.node, gpu.uuid, str(gpu.index), gpu.product_name]
            families[GPU_MEMORY_UNACCOUNTED].add_metric(labels, float(total))
        for key in self._over - over:
            log.info("claim %s's processes are back within its memory limit on GPU %s", key[0], key[1])
        self._over = over
        for key in set(self._charged) - seen:  # claims gone: forget their last reading
            del self._charged[key]

    def _report_over(
        self, claim: Claim, uuid: str, containers: Sequence[ContainerRef], held: int, limit: int
    ) -> None:
        """Name the containers of a claim whose processes hold more than its limit: once, when it
        starts (the series carries it at every scrape)."""
        if (claim.uid, uuid) in self._over:
            return
        names = ", ".join(f"{r.namespace}/{r.pod}/{r.container}" for r in containers) or "none running"
        log.warning(
            "claim %s/%s: its containers' processes (%s) hold %d bytes on GPU %s, %d past its limit "
            "of %d: memory taken around the shim",
            claim.namespace,
            claim.name,
            names,
            held,
            uuid,
            held - limit,
            limit,
        )

    def _report_outside(
        self,
        gpu: Gpu,
        listed: Mapping[int, int | None],
        accounted: set[int],
        owners: Mapping[int, ContainerRef],
    ) -> None:
        """Processes holding memory on the GPU in no container that uses a claim on it: logged
        once each (by pid), naming the container when the process is in one."""
        outside = {pid for pid, used in listed.items() if pid not in accounted and used}
        for pid in sorted(outside - self._outside.get(gpu.uuid, set())):
            ref = owners.get(pid)
            where = f"container {ref.namespace}/{ref.pod}/{ref.container}" if ref else "no container of a pod"
            log.warning(
                "process %d (%s) holds %d bytes on GPU %s that no claim on this node accounts for",
                pid,
                where,
                listed[pid] or 0,
                gpu.uuid,
            )
        self._outside[gpu.uuid] = outside

    def _utilization(
        self,
        uid: str,
        uuid: str,
        usage: shim_format.GpuUsage | None,
        ours: set[int],
        sample: GpuSample | None,
        now: float,
    ) -> tuple[float | None, bool]:
        """NVML's per-process samples of the claim's processes, summed; else the charged-time rate
        since the last scrape (None on the first scrape that sees the claim). True with a figure
        from the driver's samples: only those see compute taken around the shim."""
        charged = usage.charged_ns if usage else 0
        previous = self._charged.get((uid, uuid))
        self._charged[(uid, uuid)] = (charged, now)
        if sample is not None and sample.process_sm_percent is not None:
            percent = sum(util for pid, util in sample.process_sm_percent.items() if pid in ours)
            return min(percent, 100) / 100, True
        if previous is None or now <= previous[1] or usage is None:
            return None, False
        return max(0.0, min(1.0, (charged - previous[0]) / ((now - previous[1]) * 1e9))), False


def _pids(samples: Mapping[str, GpuSample]) -> set[int]:
    """Every process NVML sampled or lists on a GPU."""
    return {
        pid for s in samples.values() for pid in (*(s.process_sm_percent or {}), *(s.compute_memory or {}))
    }
