"""The collector: what each scrape reports from claim folders, NVML figures and the pod index.

Claim folders are written with the shim's own format functions; NVML, health, prepared records and
the pod index are plain functions, so every case is built exactly and read back through
prometheus_client's own text output and parser."""

from __future__ import annotations

import hashlib
import json
import logging
import os
from collections.abc import Callable, Sequence
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from tessera.driver.checkpoint import ClaimRecord, PreparedDevice
from tessera.driver.devices import device_name
from tessera.driver.discovery import Gpu, GpuSample
from tessera.exporter.collector import (
    CONTAINER_LABELS,
    FAMILIES,
    GPU_LABELS,
    GpuCollector,
    Sources,
)
from tessera.exporter.containers import ContainerRef
from tessera.exporter.metrics import DaemonMetrics
from tessera.quantity import GiB
from tessera.shim import format as shim_format
from tessera.shim._format import ffi as _ffi
from tessera.shim._format import lib as _lib
from tests.unit.driver.driver_samples import gpu

Series = dict[tuple[str, frozenset[tuple[str, str]]], float]


def sample(
    used: int = 5 * GiB,
    processes: dict[int, int] | None = None,
    compute_memory: dict[int, int | None] | None = None,
) -> GpuSample:
    return GpuSample(
        80 * GiB, used, 40, 61, 250_000, {} if processes is None else processes, compute_memory or {}
    )


def write_claim(claims_dir: Path, uid: str, name: str, limits: Sequence[shim_format.GpuLimit]) -> Path:
    folder = claims_dir / uid
    folder.mkdir(parents=True)
    (folder / "claim.json").write_text(json.dumps({"namespace": "ns", "name": name, "uid": uid}))
    shim_format.write_limits(folder / "limits", limits)
    shim_format.create_region(folder / "usage")
    return folder


class Bed:
    """A collector over claim folders in ``tmp_path`` and figures the test sets."""

    def __init__(self, tmp_path: Path, gpus: Sequence[Gpu]) -> None:
        self.claims_dir = tmp_path / "claims"
        self.claims_dir.mkdir()
        self.proc = tmp_path / "proc"
        self.proc.mkdir()
        self.gpus = list(gpus)
        self.samples: dict[str, GpuSample | Exception] = {g.uuid: sample() for g in gpus}
        self.problems: dict[str, object] = {}
        self.records: dict[str, ClaimRecord] = {}
        self.records_error: Exception | None = None
        self.pods: dict[tuple[str, str], list[ContainerRef]] = {}
        self.ids: dict[tuple[str, str], ContainerRef] = {}
        self.now = 1000.0
        self.registry = CollectorRegistry()
        self.metrics = DaemonMetrics("node-a")
        self.registry.register(
            GpuCollector(
                Sources(
                    node="node-a",
                    claims_dir=self.claims_dir,
                    gpus=lambda: self.gpus,
                    sample=self._sample,
                    problems=lambda: self.problems,
                    records=self._records,
                    containers=lambda ns, name: self.pods.get((ns, name), []),
                    container=lambda pod_uid, container_id: self.ids.get((pod_uid, container_id)),
                    proc=self.proc,
                    clock=lambda: self.now,
                ),
                self.metrics,
            )
        )

    def _records(self) -> dict[str, ClaimRecord]:
        if self.records_error is not None:
            raise self.records_error
        return self.records

    def _sample(self, uuid: str) -> GpuSample:
        found = self.samples[uuid]
        if isinstance(found, Exception):
            raise found
        return found

    def scrape(self) -> Series:
        text = generate_latest(self.registry).decode()
        out: Series = {}
        for family in text_string_to_metric_families(text):
            for s in family.samples:
                out[(s.name, frozenset(s.labels.items()))] = s.value
        return out

    def claimed_container(self, gpu: Gpu) -> None:
        """Claim ns/c1 (4 GiB of ``gpu``) held by container ns/p1/main, whose process is pid 100."""
        write_claim(self.claims_dir, "u1", "c1", [shim_format.GpuLimit(gpu.uuid, 4 * GiB, 0)])
        ref = ContainerRef("ns", "p1", "main")
        self.pods[("ns", "c1")] = [ref]
        self.fake_process(100, ref)

    def fake_process(self, pid: int, ref: ContainerRef | None, cgroup: str | None = None) -> None:
        """/proc/<pid>/cgroup of a process in container ``ref`` (its pod's UID and the runtime's ID
        made up from the names, as the kubelet's cgroupfs driver on cgroup v1 lays them out), or of
        a process in no pod's container (None); ``cgroup`` gives the file's text as it is."""
        folder = self.proc / str(pid)
        folder.mkdir()
        if cgroup is None and ref is not None:
            pod_uid, container_id = ids_of(ref)
            self.ids[(pod_uid, container_id)] = ref
            path = f"/node-a/kubepods/burstable/pod{pod_uid}/{container_id}"
            cgroup = "".join(
                f"{n}:{c}:{path}\n" for n, c in ((4, "memory"), (3, "cpu,cpuacct"), (1, "name=systemd"))
            )
        (folder / "cgroup").write_text(cgroup or "4:memory:/user.slice\n0::/user.slice/session-1.scope\n")


def ids_of(ref: ContainerRef) -> tuple[str, str]:
    """A pod UID and a 64-hex container ID, the same for the same container every time."""
    digest = hashlib.sha256(f"{ref.namespace}/{ref.pod}".encode()).hexdigest()
    pod_uid = f"{digest[:8]}-{digest[8:12]}-{digest[12:16]}-{digest[16:20]}-{digest[20:32]}"
    return pod_uid, hashlib.sha256(f"{ref}".encode()).hexdigest()


def values(series: Series, name: str) -> dict[frozenset[tuple[str, str]], float]:
    return {labels: v for (n, labels), v in series.items() if n == name}


def container(ns: str, pod: str, c: str, claim: str, g: Gpu) -> frozenset[tuple[str, str]]:
    return frozenset(
        {
            "namespace": ns,
            "pod": pod,
            "container": c,
            "claim": claim,
            "node": "node-a",
            "device_uuid": g.uuid,
            "device_index": str(g.index),
        }.items()
    )


def gpu_labels(g: Gpu) -> frozenset[tuple[str, str]]:
    return frozenset(
        {
            "node": "node-a",
            "device_uuid": g.uuid,
            "device_index": str(g.index),
            "model": g.product_name,
        }.items()
    )


@pytest.fixture
def bed(tmp_path: Path) -> Bed:
    return Bed(tmp_path, [gpu(0), gpu(1)])


def test_each_gpu_reports_nvml_figures_in_base_units_and_ratios(bed: Bed) -> None:
    series = bed.scrape()
    g = bed.gpus[0]
    assert values(series, "tessera_gpu_memory_total_bytes")[gpu_labels(g)] == 80 * GiB
    assert values(series, "tessera_gpu_memory_used_bytes")[gpu_labels(g)] == 5 * GiB
    assert values(series, "tessera_gpu_utilization_ratio")[gpu_labels(g)] == pytest.approx(0.40)
    assert values(series, "tessera_gpu_temperature_celsius")[gpu_labels(g)] == 61
    assert values(series, "tessera_gpu_power_watts")[gpu_labels(g)] == pytest.approx(250.0)
    assert values(series, "tessera_gpu_healthy")[gpu_labels(g)] == 1
    assert values(series, "tessera_gpu_shares")[gpu_labels(g)] == 0


def test_every_family_keeps_one_label_set(bed: Bed, tmp_path: Path) -> None:
    g = bed.gpus[0]
    write_claim(bed.claims_dir, "u1", "c1", [shim_format.GpuLimit(g.uuid, 8 * GiB, 30)])
    bed.pods[("ns", "c1")] = [ContainerRef("ns", "p1", "main")]
    series = bed.scrape()
    for name in FAMILIES:
        expected = set(CONTAINER_LABELS if name.startswith("tessera_container") else GPU_LABELS)
        found = values(series, name)
        assert found, name
        for labels in found:
            assert {k for k, _ in labels} == expected, name


def test_a_claims_limits_and_usage_are_labelled_with_its_container_and_gpu(bed: Bed) -> None:
    g = bed.gpus[1]
    write_claim(bed.claims_dir, "u1", "c1", [shim_format.GpuLimit(g.uuid, 8 * GiB, 30)])
    bed.pods[("ns", "c1")] = [ContainerRef("ns", "p1", "main")]
    series = bed.scrape()
    labels = container("ns", "p1", "main", "c1", g)
    assert values(series, "tessera_container_gpu_memory_limit_bytes") == {labels: 8 * GiB}
    assert values(series, "tessera_container_gpu_memory_used_bytes") == {labels: 0}
    assert values(series, "tessera_container_gpu_compute_limit_ratio") == {labels: pytest.approx(0.30)}
    assert values(series, "tessera_container_gpu_processes") == {labels: 0}


def test_two_containers_sharing_a_claim_each_report_the_claims_figures(bed: Bed) -> None:
    g = bed.gpus[0]
    write_claim(bed.claims_dir, "u1", "c1", [shim_format.GpuLimit(g.uuid, 8 * GiB, 0)])
    bed.pods[("ns", "c1")] = [ContainerRef("ns", "p1", "a"), ContainerRef("ns", "p1", "b")]
    limits = values(bed.scrape(), "tessera_container_gpu_memory_limit_bytes")
    assert limits == {
        container("ns", "p1", "a", "c1", g): 8 * GiB,
        container("ns", "p1", "b", "c1", g): 8 * GiB,
    }


def test_one_container_with_two_gpus_has_one_series_per_gpu(bed: Bed) -> None:
    g0, g1 = bed.gpus
    write_claim(
        bed.claims_dir,
        "u1",
        "c1",
        [shim_format.GpuLimit(g0.uuid, 8 * GiB, 20), shim_format.GpuLimit(g1.uuid, 4 * GiB, 50)],
    )
    bed.pods[("ns", "c1")] = [ContainerRef("ns", "p1", "main")]
    series = bed.scrape()
    assert values(series, "tessera_container_gpu_memory_limit_bytes") == {
        container("ns", "p1", "main", "c1", g0): 8 * GiB,
        container("ns", "p1", "main", "c1", g1): 4 * GiB,
    }
    assert values(series, "tessera_container_gpu_compute_limit_ratio") == {
        container("ns", "p1", "main", "c1", g0): pytest.approx(0.2),
        container("ns", "p1", "main", "c1", g1): pytest.approx(0.5),
    }


def test_uncapped_and_unlimited_claims_report_the_whole_gpu_as_their_limits(bed: Bed) -> None:
    g = bed.gpus[0]
    write_claim(bed.claims_dir, "u1", "c1", [shim_format.GpuLimit(g.uuid, None, 0)])
    bed.pods[("ns", "c1")] = [ContainerRef("ns", "p1", "main")]
    series = bed.scrape()
    labels = container("ns", "p1", "main", "c1", g)
    assert values(series, "tessera_container_gpu_memory_limit_bytes") == {labels: g.memory_bytes}
    assert values(series, "tessera_container_gpu_compute_limit_ratio") == {labels: 1.0}


def test_a_claim_without_running_containers_has_no_container_series_but_still_counts_as_allocated(
    bed: Bed,
) -> None:
    g = bed.gpus[0]
    write_claim(bed.claims_dir, "u1", "c1", [shim_format.GpuLimit(g.uuid, 8 * GiB, 30)])
    series = bed.scrape()
    assert values(series, "tessera_container_gpu_memory_used_bytes") == {}
    assert values(series, "tessera_gpu_memory_allocated_bytes")[gpu_labels(g)] == 8 * GiB


def test_allocations_sum_every_claims_memory_cores_and_shares_per_gpu(bed: Bed) -> None:
    g0, g1 = bed.gpus
    write_claim(bed.claims_dir, "u1", "c1", [shim_format.GpuLimit(g0.uuid, 8 * GiB, 30)])
    write_claim(
        bed.claims_dir,
        "u2",
        "c2",
        [shim_format.GpuLimit(g0.uuid, 16 * GiB, 40), shim_format.GpuLimit(g1.uuid, 2 * GiB, 10)],
    )

    def share(uid: str, g: Gpu, n: int) -> PreparedDevice:
        return PreparedDevice(("gpu",), "node-a", device_name(g), (f"{uid}-{n}",), f"s-{n}")

    bed.records = {
        "u1": ClaimRecord("u1", "ns", "c1", "PrepareCompleted", (share("u1", g0, 1),)),
        # Two shares of GPU 0 in one claim (two requests landed on it), one of GPU 1.
        "u2": ClaimRecord(
            "u2", "ns", "c2", "PrepareCompleted", (share("u2", g0, 2), share("u2", g0, 3), share("u2", g1, 4))
        ),
    }
    series = bed.scrape()
    assert values(series, "tessera_gpu_memory_allocated_bytes") == {
        gpu_labels(g0): 24 * GiB,
        gpu_labels(g1): 2 * GiB,
    }
    assert values(series, "tessera_gpu_compute_allocated_ratio") == {
        gpu_labels(g0): pytest.approx(0.7),
        gpu_labels(g1): pytest.approx(0.1),
    }
    assert values(series, "tessera_gpu_shares") == {gpu_labels(g0): 3, gpu_labels(g1): 1}


def test_an_unhealthy_gpu_reads_0_and_its_unreadable_figures_are_left_out_and_counted(bed: Bed) -> None:
    g0, g1 = bed.gpus
    bed.problems = {g1.uuid: "GPU is lost"}
    bed.samples[g1.uuid] = RuntimeError("GPU is lost")
    series = bed.scrape()
    assert values(series, "tessera_gpu_healthy") == {gpu_labels(g0): 1, gpu_labels(g1): 0}
    assert set(values(series, "tessera_gpu_memory_used_bytes")) == {gpu_labels(g0)}
    errors = values(series, "tessera_exporter_scrape_errors_total")
    assert errors[frozenset({"node": "node-a", "source": "nvml"}.items())] == 1
    assert errors[frozenset({"node": "node-a", "source": "region"}.items())] == 0


def test_unreadable_prepared_claims_leave_out_the_shares_and_are_counted(bed: Bed) -> None:
    bed.records_error = ValueError("checksum mismatch: the file was changed or cut short")
    series = bed.scrape()
    assert values(series, "tessera_gpu_shares") == {}
    assert values(series, "tessera_gpu_healthy")[gpu_labels(bed.gpus[0])] == 1
    errors = values(series, "tessera_exporter_scrape_errors_total")
    assert errors[frozenset({"node": "node-a", "source": "claim"}.items())] == 1


def test_a_sensor_nvml_does_not_support_drops_only_that_series(bed: Bed) -> None:
    g0, _ = bed.gpus
    bed.samples[g0.uuid] = GpuSample(80 * GiB, 0, 0, None, None, None)
    series = bed.scrape()
    assert gpu_labels(g0) not in values(series, "tessera_gpu_temperature_celsius")
    assert gpu_labels(g0) not in values(series, "tessera_gpu_power_watts")
    assert gpu_labels(g0) in values(series, "tessera_gpu_utilization_ratio")


def test_utilisation_and_processes_count_only_processes_in_the_claims_containers(bed: Bed) -> None:
    """A process belongs to the container its cgroup names (pod UID and runtime container ID, as
    the pod's status reports them), and through it to the container's claims, whether or not it
    ever allocated memory and whatever its environment says."""
    g = bed.gpus[0]
    write_claim(bed.claims_dir, "u1", "c1", [shim_format.GpuLimit(g.uuid, 8 * GiB, 30)])
    write_claim(bed.claims_dir, "u2", "c2", [shim_format.GpuLimit(g.uuid, 8 * GiB, 30)])
    p1, p2 = ContainerRef("ns", "p1", "main"), ContainerRef("ns", "p2", "main")
    bed.pods[("ns", "c1")] = [p1]
    bed.pods[("ns", "c2")] = [p2]
    bed.fake_process(4242, p1)
    bed.fake_process(4243, p1)
    bed.fake_process(5000, p2)
    bed.fake_process(6000, None)  # a host process, in no pod
    bed.samples[g.uuid] = sample(
        processes={4242: 20, 4243: 5, 5000: 30, 6000: 40}, compute_memory={4242: 0, 4243: 0, 5000: 0}
    )
    series = bed.scrape()
    assert values(series, "tessera_container_gpu_utilization_ratio") == {
        container("ns", "p1", "main", "c1", g): pytest.approx(0.25),
        container("ns", "p2", "main", "c2", g): pytest.approx(0.30),
    }
    assert values(series, "tessera_container_gpu_processes") == {
        container("ns", "p1", "main", "c1", g): 2,
        container("ns", "p2", "main", "c2", g): 1,
    }
    assert values(series, "tessera_gpu_processes")[gpu_labels(g)] == 3


def test_the_driver_memory_of_each_container_stands_next_to_what_the_shim_charged(bed: Bed) -> None:
    """Two containers share a 4 GiB claim; one of them holds 3 GiB, the other 2 GiB that the shim
    never saw (the real driver library opened by its path): the claim's processes hold 1 GiB past
    its limit, and that 1 GiB is what the GPU has that no claim accounts for, with a host process's
    memory added."""
    g = bed.gpus[0]
    write_claim(bed.claims_dir, "u1", "c1", [shim_format.GpuLimit(g.uuid, 4 * GiB, 0)])
    a, b = ContainerRef("ns", "p1", "a"), ContainerRef("ns", "p1", "b")
    bed.pods[("ns", "c1")] = [a, b]
    bed.fake_process(100, a)
    bed.fake_process(101, b)
    bed.fake_process(102, None)
    bed.samples[g.uuid] = sample(compute_memory={100: 3 * GiB, 101: 2 * GiB, 102: GiB // 2})
    series = bed.scrape()
    assert values(series, "tessera_container_gpu_memory_driver_bytes") == {
        container("ns", "p1", "a", "c1", g): 3 * GiB,
        container("ns", "p1", "b", "c1", g): 2 * GiB,
    }
    assert values(series, "tessera_container_gpu_memory_excess_bytes") == {
        container("ns", "p1", "a", "c1", g): GiB,
        container("ns", "p1", "b", "c1", g): GiB,
    }
    assert values(series, "tessera_container_gpu_memory_used_bytes") == {
        container("ns", "p1", "a", "c1", g): 0,
        container("ns", "p1", "b", "c1", g): 0,
    }
    unaccounted = values(series, "tessera_gpu_memory_unaccounted_bytes")
    assert unaccounted == {gpu_labels(g): GiB + GiB // 2, gpu_labels(bed.gpus[1]): 0}


def test_a_container_using_a_gpu_its_claims_do_not_cover_is_unaccounted_there(bed: Bed) -> None:
    g0, g1 = bed.gpus
    bed.claimed_container(g0)
    bed.samples[g0.uuid] = sample(compute_memory={100: GiB})
    bed.samples[g1.uuid] = sample(compute_memory={100: 3 * GiB})
    series = bed.scrape()
    assert values(series, "tessera_container_gpu_memory_excess_bytes") == {
        container("ns", "p1", "main", "c1", g0): 0
    }
    assert values(series, "tessera_gpu_memory_unaccounted_bytes") == {
        gpu_labels(g0): 0,
        gpu_labels(g1): 3 * GiB,
    }


def test_a_process_the_driver_gives_no_memory_figure_for_leaves_the_figures_it_is_part_of_out(
    bed: Bed,
) -> None:
    """NVML's "not available" is not 0: a sum that would hide memory is not exported."""
    g = bed.gpus[0]
    bed.claimed_container(g)
    bed.fake_process(200, None)
    bed.samples[g.uuid] = sample(compute_memory={100: None, 200: GiB})
    series = bed.scrape()
    assert values(series, "tessera_container_gpu_memory_driver_bytes") == {}
    assert values(series, "tessera_container_gpu_memory_excess_bytes") == {}
    assert gpu_labels(g) not in values(series, "tessera_gpu_memory_unaccounted_bytes")
    bed.samples[g.uuid] = sample(compute_memory={100: GiB, 200: None})
    assert gpu_labels(g) not in values(bed.scrape(), "tessera_gpu_memory_unaccounted_bytes")


def test_a_container_past_its_claim_is_named_in_the_log_once_per_change(
    bed: Bed, caplog: pytest.LogCaptureFixture
) -> None:
    g = bed.gpus[0]
    bed.claimed_container(g)
    bed.fake_process(200, None)
    bed.samples[g.uuid] = sample(compute_memory={100: 5 * GiB, 200: GiB})
    caplog.set_level(logging.INFO, logger="tessera.exporter.collector")

    def lines() -> list[str]:
        return [r.getMessage() for r in caplog.records]

    bed.scrape()
    bed.scrape()
    over = [m for m in lines() if "ns/p1/main" in m]
    assert len(over) == 1 and "claim ns/c1" in over[0] and str(GiB) in over[0], lines()
    outside = [m for m in lines() if "process 200" in m]
    assert len(outside) == 1 and "no container of a pod" in outside[0], lines()
    caplog.clear()
    bed.samples[g.uuid] = sample(compute_memory={100: 3 * GiB})
    bed.scrape()
    bed.scrape()
    assert [m for m in lines() if "back within" in m] == [
        f"claim u1's processes are back within its memory limit on GPU {g.uuid}"
    ]


def test_processes_are_matched_by_cgroup_and_nothing_else_in_proc(bed: Bed) -> None:
    """Only /proc/<pid>/cgroup is read: a process whose environment or root names a claim's
    region, but whose cgroup is no pod's container, belongs to no claim."""
    g = bed.gpus[0]
    folder = write_claim(bed.claims_dir, "u1", "c1", [shim_format.GpuLimit(g.uuid, 4 * GiB, 0)])
    bed.pods[("ns", "c1")] = [ContainerRef("ns", "p1", "main")]
    bed.fake_process(100, None)
    (bed.proc / "100" / "environ").write_bytes(f"TESSERA_USAGE_REGION={folder / 'usage'}\0".encode())
    (bed.proc / "100" / "root").symlink_to("/")
    bed.samples[g.uuid] = sample(processes={100: 50}, compute_memory={100: GiB})
    series = bed.scrape()
    assert values(series, "tessera_container_gpu_processes") == {container("ns", "p1", "main", "c1", g): 0}
    assert values(series, "tessera_gpu_memory_unaccounted_bytes")[gpu_labels(g)] == GiB


def charge(region: Path, uuid: str, charged_ns: int) -> None:
    """Set the GPU time the shim has charged the claim on ``uuid``, as its compute controller does."""
    handle = _ffi.new("struct tessera_region_handle *")
    assert _lib.tessera_region_open(str(region).encode(), handle, _ffi.NULL, 0) == 0
    try:
        index = _lib.tessera_region_gpu(handle.map, uuid.encode())
        assert index >= 0
        handle.map.gpus[index].charged_ns = charged_ns
    finally:
        _lib.tessera_region_close(handle)


def test_compute_past_the_cap_by_the_drivers_own_samples_is_the_claims_utilisation_excess(bed: Bed) -> None:
    """A 30 % claim whose processes the driver samples at 45 % took 15 % of the GPU around the
    shim's cap; an uncapped claim never exceeds it."""
    g = bed.gpus[0]
    write_claim(bed.claims_dir, "u1", "c1", [shim_format.GpuLimit(g.uuid, 8 * GiB, 30)])
    write_claim(bed.claims_dir, "u2", "c2", [shim_format.GpuLimit(g.uuid, 8 * GiB, 0)])
    p1, p2 = ContainerRef("ns", "p1", "main"), ContainerRef("ns", "p2", "main")
    bed.pods[("ns", "c1")] = [p1]
    bed.pods[("ns", "c2")] = [p2]
    bed.fake_process(4242, p1)
    bed.fake_process(4243, p1)
    bed.fake_process(5000, p2)
    bed.samples[g.uuid] = sample(processes={4242: 40, 4243: 5, 5000: 50}, compute_memory={4242: 0, 5000: 0})
    assert values(bed.scrape(), "tessera_container_gpu_utilization_excess_ratio") == {
        container("ns", "p1", "main", "c1", g): pytest.approx(0.15),
        container("ns", "p2", "main", "c2", g): 0,
    }
    bed.samples[g.uuid] = sample(processes={4242: 20}, compute_memory={4242: 0})
    assert (
        values(bed.scrape(), "tessera_container_gpu_utilization_excess_ratio")[
            container("ns", "p1", "main", "c1", g)
        ]
        == 0
    )


def test_without_per_process_samples_utilisation_is_the_charged_gpu_time_since_the_last_scrape(
    bed: Bed,
) -> None:
    """A driver that gives no per-process utilisation: the claim's share is the GPU time its compute
    controller charged between two scrapes over the time between them (none on the first scrape,
    which has nothing to compare with), held to 0-1."""
    g = bed.gpus[0]
    folder = write_claim(bed.claims_dir, "u1", "c1", [shim_format.GpuLimit(g.uuid, 8 * GiB, 30)])
    bed.pods[("ns", "c1")] = [ContainerRef("ns", "p1", "main")]
    bed.samples[g.uuid] = GpuSample(80 * GiB, 0, 40, 61, 250_000, None, None)
    labels = container("ns", "p1", "main", "c1", g)
    charge(folder / "usage", g.uuid, 5_000_000_000)
    assert values(bed.scrape(), "tessera_container_gpu_utilization_ratio") == {}
    bed.now += 10.0
    charge(folder / "usage", g.uuid, 8_000_000_000)  # 3 s of GPU time in 10 s
    assert values(bed.scrape(), "tessera_container_gpu_utilization_ratio") == {labels: pytest.approx(0.3)}
    bed.now += 1.0
    charge(folder / "usage", g.uuid, 10_000_000_000)  # 2 s in 1 s: more than the GPU has
    assert values(bed.scrape(), "tessera_container_gpu_utilization_ratio") == {labels: 1.0}
    bed.now += 5.0  # nothing charged
    series = bed.scrape()
    assert values(series, "tessera_container_gpu_utilization_ratio") == {labels: 0.0}
    # What the shim charged says nothing of compute taken around it: no excess without samples.
    assert values(series, "tessera_container_gpu_utilization_excess_ratio") == {}


def replace_with(path: Path, make: Callable[[Path], None]) -> None:
    path.unlink()
    make(path)


@pytest.mark.parametrize(
    "damage",
    [
        lambda p: os.truncate(p, 0),
        lambda p: os.truncate(p, 5000),
        lambda p: os.truncate(p, p.stat().st_size + 4096),
        lambda p: p.write_bytes(b"\xff" * p.stat().st_size),
        lambda p: replace_with(p, os.mkfifo),
        lambda p: replace_with(p, os.mkdir),
    ],
    ids=["truncated-to-0", "truncated-mid-slot", "grown", "scribbled", "fifo", "directory"],
)
def test_a_region_a_tenant_damaged_costs_only_its_own_claims_usage_figure(bed: Bed, damage: object) -> None:
    """What the container can do to its world-writable region: the claim's used figure goes (unknown,
    not 0), counted as a region error; its limits stay, the neighbour's figures are unchanged, and the
    scrape - the daemon - carries on. The region is only ever read, never mapped or written."""
    g = bed.gpus[0]
    write_claim(bed.claims_dir, "u1", "c1", [shim_format.GpuLimit(g.uuid, 8 * GiB, 30)])
    bad = write_claim(bed.claims_dir, "u2", "c2", [shim_format.GpuLimit(g.uuid, 4 * GiB, 30)])
    bed.pods[("ns", "c1")] = [ContainerRef("ns", "p1", "main")]
    bed.pods[("ns", "c2")] = [ContainerRef("ns", "p2", "main")]
    before = bed.scrape()
    assert callable(damage)
    damage(bad / "usage")
    after = bed.scrape()
    good = container("ns", "p1", "main", "c1", g)
    damaged = container("ns", "p2", "main", "c2", g)
    for name in FAMILIES:
        if name.startswith("tessera_container"):
            assert values(after, name).get(good) == values(before, name).get(good), name
    assert damaged not in values(after, "tessera_container_gpu_memory_used_bytes")
    assert values(after, "tessera_container_gpu_memory_limit_bytes")[damaged] == 4 * GiB
    errors = values(after, "tessera_exporter_scrape_errors_total")
    assert errors[frozenset({"node": "node-a", "source": "region"}.items())] == 1
    assert values(after, "tessera_gpu_memory_allocated_bytes")[gpu_labels(g)] == 12 * GiB
    maps = Path("/proc/self/maps").read_text()
    assert str(bad / "usage") not in maps


def test_damaged_claim_folders_are_skipped_and_counted_without_failing_the_scrape(bed: Bed) -> None:
    g = bed.gpus[0]
    good = write_claim(bed.claims_dir, "u1", "c1", [shim_format.GpuLimit(g.uuid, 8 * GiB, 30)])
    bad = write_claim(bed.claims_dir, "u2", "c2", [shim_format.GpuLimit(g.uuid, 4 * GiB, 30)])
    (bad / "limits").chmod(0o644)
    (bad / "limits").write_text("not a limits file\n")
    bed.pods[("ns", "c1")] = [ContainerRef("ns", "p1", "main")]
    bed.pods[("ns", "c2")] = [ContainerRef("ns", "p2", "main")]
    series = bed.scrape()
    assert set(values(series, "tessera_container_gpu_memory_limit_bytes")) == {
        container("ns", "p1", "main", "c1", g)
    }
    errors = values(series, "tessera_exporter_scrape_errors_total")
    assert errors[frozenset({"node": "node-a", "source": "limits"}.items())] == 1
    assert good.exists()


def test_a_folder_being_written_is_skipped_without_an_error(bed: Bed) -> None:
    (bed.claims_dir / "u-new").mkdir()
    series = bed.scrape()
    assert all(v == 0 for v in values(series, "tessera_exporter_scrape_errors_total").values())


def test_each_scrape_is_counted_as_it_starts_and_timed(bed: Bed) -> None:
    node = frozenset({"node": "node-a"}.items())
    first = bed.scrape()
    second = bed.scrape()
    assert values(first, "tessera_exporter_scrapes_total")[node] == 1
    assert values(second, "tessera_exporter_scrapes_total")[node] == 2
    # The duration of a scrape is observed when it ends, so the second scrape shows the first.
    assert values(second, "tessera_exporter_scrape_duration_seconds_count")[node] == 1


def test_build_info_names_the_node_and_version(bed: Bed) -> None:
    (labels,) = values(bed.scrape(), "tessera_build_info")
    assert dict(labels)["node"] == "node-a"
    assert dict(labels)["version"]
