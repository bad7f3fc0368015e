"""GPU metrics read the way a user reads them: a real Prometheus scraping the node daemon's /metrics
and evaluating the shipped alert rules, the daemon running under the chart's RBAC over simulated
GPUs, and real processes under the shim using a prepared claim's limits file and usage region.

The node is kubelet-less (the test makes the kubelet's prepare call), so the claim's processes run
on the host with the shim preloaded, pointed at the claim's own files, exactly as the container's
processes are (tests/e2e/test_driver_node.py covers the container side). The test also plays the
kubelet's part in what ties a process to its container: it starts them in the cgroup a kubelet with
the cgroupfs driver would give the pod's container, and writes that container's ID into the pod's
status, as the kubelet reports it. "Within one scrape" is
checked by scrape number: the exporter counts each scrape as it starts
(``tessera_exporter_scrapes_total``); the test reads that count after the event, and the next
scrape Prometheus makes must already show the change.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import subprocess
import textwrap
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client
from prometheus_client.parser import text_string_to_metric_families

from simgpu.config import library_dir, process_env
from tessera.exporter.collector import FAMILIES
from tessera.quantity import GiB
from tessera.shim.format import GpuLimit, read_limits
from tessera.shim.install import install
from testbed.cluster import LocalCluster
from testbed.driver_node import DriverNode, ensure_device_class
from testbed.kubelet_client import KubeletClient
from testbed.node_host import cgroup_mounts, remove_cgroup_tree
from testbed.polling import poll_until
from testbed.prometheus import RULES_FILE, Prometheus, Sample, promtool
from testbed.share_pods import share_pod
from testbed.shim_harness import PROGRAM_BUILD, SIMGPU_BUILD, Claim, build_programs, build_shim, values

pytestmark = pytest.mark.integration

USED = "tessera_container_gpu_memory_used_bytes"
LIMIT = "tessera_container_gpu_memory_limit_bytes"
DRIVER = "tessera_container_gpu_memory_driver_bytes"
EXCESS = "tessera_container_gpu_memory_excess_bytes"
UNACCOUNTED = "tessera_gpu_memory_unaccounted_bytes"


@dataclass
class Bed:
    node: DriverNode
    prometheus: Prometheus
    programs: Path

    def scrape_number(self) -> int:
        """The exporter's scrape count now (this read is itself a scrape)."""
        for family in text_string_to_metric_families(self.node.scrape()):
            for s in family.samples:
                if s.name == "tessera_exporter_scrapes_total":
                    return int(s.value)
        raise AssertionError("no tessera_exporter_scrapes_total in the scrape")

    def at_scrape(self, expr: str, scrape: int) -> list[Sample]:
        """``expr`` as Prometheus stored it from the exporter's scrape number ``scrape`` (possibly
        no series)."""

        def made() -> tuple[list[Sample]] | None:
            found = self.prometheus.series_at_scrape(expr, self.node.node_name, scrape)
            return None if found is None else (found,)

        return poll_until(made, 60, f"Prometheus's scrape number {scrape} of {self.node.node_name}")[0]


@pytest.fixture
def bed(cluster: LocalCluster, kube: client.ApiClient, fake_node: Callable[..., str]) -> Iterator[Bed]:
    build_shim()
    subprocess.run(["make", "-C", "simgpu", "-j2"], check=True, capture_output=True)
    programs = build_programs(PROGRAM_BUILD, SIMGPU_BUILD)
    ensure_device_class(kube)
    node = DriverNode(cluster, fake_node(), gpus=2, memory_bytes=16 * GiB)
    node.start()
    node.wait_published()
    prometheus = Prometheus([f"{node.metrics_address}:{node.metrics_port}"])
    yield Bed(node, prometheus, programs)
    prometheus.stop()
    node.cleanup()


def prepared_claim(bed: Bed, namespace: str, claim: str, uid: str, tmp_path: Path) -> Claim:
    """Prepare the claim through the DRA socket; processes started from the result run as the
    claim's processes on the host: the shim preloaded over the simulated driver, reading the
    claim's own limits file and usage region."""
    kubelet = KubeletClient(bed.node.dra_socket)
    try:
        response = kubelet.prepare([(namespace, claim, uid)])
    finally:
        kubelet.close()
    assert response.claims[uid].error == ""
    folder = bed.node.state_dir / "claims" / uid
    libs = library_dir()
    installation = install(tmp_path / f"shim-{uid}", libs / "libcuda.so.1", libs / "libnvidia-ml.so.1")
    limits = read_limits(folder / "limits")
    assert limits is not None
    # What the CDI spec gives the container: only the claim's GPUs are visible.
    visible = {"CUDA_VISIBLE_DEVICES": ",".join(g.uuid for g in limits)}
    return Claim(
        installation.directory,
        folder / "limits",
        folder / "usage",
        process_env(bed.node.simgpu.config),
        bed.programs,
        extra_env=visible,
    )


@contextlib.contextmanager
def in_container(kube: client.ApiClient, namespace: str, pod: str, container: str = "main") -> Iterator[str]:
    """This process, and every process it starts meanwhile, in the cgroup the kubelet's cgroupfs
    driver gives container ``container`` of ``pod`` (``kubepods/besteffort/pod<uid>/<id>``), with
    the pod's status naming that container's ID as the kubelet reports it: the kernel fact and the
    API fact the exporter ties GPU processes to containers by. Yields the container ID."""
    core = client.CoreV1Api(kube)
    metadata = core.read_namespaced_pod(pod, namespace).metadata
    assert metadata is not None
    uid = metadata.uid
    container_id = secrets.token_hex(32)
    status = {
        "name": container,
        "containerID": f"containerd://{container_id}",
        "image": "none",
        "imageID": "",
        "ready": True,
        "restartCount": 0,
        "state": {"running": {}},
    }
    core.patch_namespaced_pod_status(pod, namespace, {"status": {"containerStatuses": [status]}})
    mounts = cgroup_mounts()
    mount = next((m for m in mounts if m.name == "pids"), None) or next(
        m for m in mounts if (m / "cgroup.controllers").exists()
    )
    top = f"tessera-it-{container_id[:12]}"
    group = mount / top / "kubepods" / "besteffort" / f"pod{uid}" / container_id
    group.mkdir(parents=True)
    own = own_cgroup(mount)
    (group / "cgroup.procs").write_text(str(os.getpid()))
    try:
        yield container_id
    finally:
        (own / "cgroup.procs").write_text(str(os.getpid()))
        remove_cgroup_tree(top)


def own_cgroup(mount: Path) -> Path:
    """This process's cgroup folder in the hierarchy mounted at ``mount`` (v1 pids, or v2)."""
    for line in Path("/proc/self/cgroup").read_text().splitlines():
        number, controllers, path = line.split(":", 2)
        if (mount.name == "pids" and "pids" in controllers.split(",")) or (number == "0" and not controllers):
            return mount / path.lstrip("/")
    raise AssertionError(f"no line of /proc/self/cgroup for {mount}")


def hold(claim: Claim, nbytes: int) -> subprocess.Popen[str]:
    """A process of the claim that allocates ``nbytes`` and holds them until its stdin closes."""
    process = claim.start("shim_probe", "alloc", "mem", str(nbytes), "hold")
    assert process.stdout is not None
    lines = []
    for line in process.stdout:
        lines.append(line)
        if line.startswith("HOLD"):
            break
    assert values("".join(lines)).get("rc") == "0", "".join(lines) + (
        process.stderr.read() if process.stderr else ""
    )
    return process


def one(samples: list[Sample]) -> Sample:
    assert len(samples) == 1, samples
    return samples[0]


def test_promtool_accepts_the_shipped_rules_and_a_real_scrape_with_every_family(
    bed: Bed, kube: client.ApiClient, namespace: str, tmp_path: Path
) -> None:
    _, claim, uid = share_pod(kube, namespace, bed.node.node_name, "p", memory="8Gi", cores="30")
    prepared_claim(bed, namespace, claim, uid, tmp_path)
    rules = promtool("check", "rules", str(RULES_FILE))
    assert rules.returncode == 0, rules.stdout + rules.stderr
    scrape = bed.node.scrape()
    checked = promtool("check", "metrics", stdin=scrape)
    assert checked.returncode == 0, checked.stdout + checked.stderr + scrape
    names = {f.name for f in text_string_to_metric_families(scrape)}
    # Utilisation needs one process sample or two scrapes; every other family is there at once.
    assert set(FAMILIES) - {"tessera_container_gpu_utilization_ratio"} <= names
    # Prometheus loaded the shipped rules and scrapes the node.
    assert {g["file"] for g in bed.prometheus.rule_groups()} == {str(RULES_FILE)}
    poll_until(bed.prometheus.targets_up, 30, "target up")


def test_a_containers_usage_shows_within_one_scrape_and_goes_when_its_process_exits_or_is_killed(
    bed: Bed, kube: client.ApiClient, namespace: str, tmp_path: Path
) -> None:
    _, claim, uid = share_pod(kube, namespace, bed.node.node_name, "p", memory="8Gi", cores="30")
    proc = prepared_claim(bed, namespace, claim, uid, tmp_path)
    limits = read_limits(bed.node.state_dir / "claims" / uid / "limits")
    assert limits is not None
    ((gpu_limit),) = limits
    assert isinstance(gpu_limit, GpuLimit)
    selector = f'{{namespace="{namespace}", pod="p", container="main"}}'
    with in_container(kube, namespace, "p"):
        process = hold(proc, 3 * GiB)
        n = bed.scrape_number()
        used = one(bed.at_scrape(USED + selector, n + 1))
        limit = one(bed.at_scrape(LIMIT + selector, n + 1))
        assert used.value == 3 * GiB
        assert limit.value == 8 * GiB
        # What the driver reports for the container's process: the same 3 GiB, nothing past the claim.
        assert one(bed.at_scrape(DRIVER + selector, n + 1)).value == 3 * GiB
        assert one(bed.at_scrape(EXCESS + selector, n + 1)).value == 0
        index = [g.uuid for g in bed.node.simgpu.spec.gpus].index(gpu_limit.uuid)
        expected = {
            "namespace": namespace,
            "pod": "p",
            "container": "main",
            "claim": claim,
            "node": bed.node.node_name,
            "device_uuid": gpu_limit.uuid,
            "device_index": str(index),
        }
        assert {k: used.labels[k] for k in expected} == expected
        assert {k: limit.labels[k] for k in expected} == expected

        # The process frees and exits: 0 at the next scrape.
        assert process.stdin is not None
        process.stdin.close()
        assert process.wait(timeout=60) == 0
        n = bed.scrape_number()
        assert one(bed.at_scrape(USED + selector, n + 1)).value == 0

        # SIGKILL while holding: the exporter skips the dead slot, 0 within two scrapes.
        process = hold(proc, 3 * GiB)
        n = bed.scrape_number()
        assert one(bed.at_scrape(USED + selector, n + 1)).value == 3 * GiB
        process.kill()
        process.wait(timeout=60)
    n = bed.scrape_number()
    assert one(bed.at_scrape(USED + selector, n + 2)).value == 0

    # The pod goes: its series go with it (the claim stays prepared until the kubelet unprepares).
    client.CoreV1Api(kube).delete_namespaced_pod("p", namespace, grace_period_seconds=0)
    poll_until(
        lambda: (
            not any('pod="p"' in line for line in bed.node.scrape().splitlines() if line.startswith(USED))
        ),
        30,
        "the deleted pod's series gone from the exporter",
    )
    n = bed.scrape_number()
    assert bed.at_scrape(USED + selector, n + 1) == []


def test_a_capped_containers_utilisation_matches_the_simulated_gpus_own_figure(
    bed: Bed, kube: client.ApiClient, namespace: str, tmp_path: Path
) -> None:
    _, claim, uid = share_pod(kube, namespace, bed.node.node_name, "p", memory="1Gi", cores="30")
    proc = prepared_claim(bed, namespace, claim, uid, tmp_path)
    limits = read_limits(bed.node.state_dir / "claims" / uid / "limits")
    assert limits is not None
    uuid = limits[0].uuid
    # 2 ms kernels for 20 s, four in flight: the cap, not the launch rate, sets the share.
    with in_container(kube, namespace, "p"):
        duty = proc.start("shim_probe", "duty", str(2_000_000), "20", "4")
        try:
            selector = f'{{namespace="{namespace}", pod="p", container="main"}}'
            gpu = f'{{device_uuid="{uuid}"}}'

            def busy_scrape() -> tuple[float, float] | None:
                n = bed.scrape_number()
                ours = bed.at_scrape("tessera_container_gpu_utilization_ratio" + selector, n + 1)
                simulated = bed.at_scrape("tessera_gpu_utilization_ratio" + gpu, n + 1)
                if not ours or not simulated or simulated[0].value < 0.2:
                    return None  # the workload has not filled NVML's sample window yet
                return ours[0].value, simulated[0].value

            ours, simulated = poll_until(busy_scrape, 60, "a scrape while the capped workload runs")
        finally:
            duty.kill()
            duty.wait(timeout=60)
    # The device's own figure, with this claim its only user, is the simulated driver's count of
    # busy time; the container's comes from the per-process samples of the claim's processes.
    assert abs(ours - simulated) <= 0.03, (ours, simulated)
    assert ours <= 0.30 + 0.03, ours


def test_a_container_past_90_percent_of_its_memory_limit_fires_the_shipped_alert(
    bed: Bed, kube: client.ApiClient, namespace: str, tmp_path: Path
) -> None:
    _, claim, uid = share_pod(kube, namespace, bed.node.node_name, "p", memory="1Gi")
    proc = prepared_claim(bed, namespace, claim, uid, tmp_path)
    process = hold(proc, 950 * 1024 * 1024)
    try:

        def firing() -> dict[str, Any] | None:
            for alert in bed.prometheus.alerts():
                labels = alert["labels"]
                if (
                    labels["alertname"] == "TesseraContainerGpuMemoryNearLimit"
                    and labels.get("claim") == claim
                ):
                    return alert if alert["state"] == "firing" else None
            return None

        # The rule's `for: 1m` holds it pending for a minute of evaluations first.
        alert = poll_until(firing, 150, "TesseraContainerGpuMemoryNearLimit firing", interval=1.0)
    finally:
        assert process.stdin is not None
        process.stdin.close()
        process.wait(timeout=60)
    assert alert["labels"]["namespace"] == namespace
    assert alert["labels"]["container"] == "main"
    assert float(alert["value"]) == pytest.approx(950 / 1024, abs=0.001)


def test_a_process_that_bypasses_the_shim_shows_as_its_containers_excess_and_fires_the_alert(
    bed: Bed, kube: client.ApiClient, namespace: str, tmp_path: Path
) -> None:
    """A process of the container that reaches the driver without the shim (no preload: the real
    library by its path) allocates past the claim: the shim charged nothing for it, the driver
    reports it all, and the excess names the container, is memory the GPU has that no claim accounts
    for, is logged once naming the container, and fires TesseraGpuMemoryUnaccounted."""
    _, claim, uid = share_pod(kube, namespace, bed.node.node_name, "p", memory="1Gi")
    proc = prepared_claim(bed, namespace, claim, uid, tmp_path)
    with in_container(kube, namespace, "p"):
        shimmed = hold(proc, 512 * 1024 * 1024)
        bypass = proc.start("shim_probe", "alloc", "mem", str(3 * GiB), "hold", env={"LD_PRELOAD": ""})
        try:
            assert bypass.stdout is not None
            lines = [bypass.stdout.readline()]
            while not lines[-1].startswith("HOLD") and lines[-1]:
                lines.append(bypass.stdout.readline())
            assert values("".join(lines)).get("rc") == "0", lines
            selector = f'{{namespace="{namespace}", pod="p", container="main"}}'
            n = bed.scrape_number()
            assert one(bed.at_scrape(USED + selector, n + 1)).value == 512 * 1024 * 1024
            assert one(bed.at_scrape(DRIVER + selector, n + 1)).value == 3 * GiB + 512 * 1024 * 1024
            excess = one(bed.at_scrape(EXCESS + selector, n + 1))
            assert excess.value == 2.5 * GiB
            assert excess.labels["claim"] == claim
            gpu = f'{{device_uuid="{excess.labels["device_uuid"]}"}}'
            assert one(bed.at_scrape(UNACCOUNTED + gpu, n + 1)).value == 2.5 * GiB

            def firing() -> dict[str, Any] | None:
                for alert in bed.prometheus.alerts():
                    labels = alert["labels"]
                    if (
                        labels["alertname"] == "TesseraGpuMemoryUnaccounted"
                        and labels.get("device_uuid") == excess.labels["device_uuid"]
                    ):
                        return alert if alert["state"] == "firing" else None
                return None

            # The rule's `for: 1m` holds it pending for a minute of evaluations first.
            alert = poll_until(firing, 150, "TesseraGpuMemoryUnaccounted firing", interval=1.0)
            assert alert["labels"]["node"] == bed.node.node_name
        finally:
            for process in (shimmed, bypass):
                process.kill()
                process.wait(timeout=60)
    named = [
        line
        for log in bed.node.work_dir.glob("tessera-exporter-*.log")
        for line in log.read_text().splitlines()
        if f"{namespace}/p/main" in line and "past its limit" in line
    ]
    assert len(named) == 1, named  # once when it started, not at every scrape


def test_promtool_fires_the_unaccounted_memory_alert_only_past_the_per_process_tolerance(
    tmp_path: Path,
) -> None:
    """The shipped rule evaluated by promtool's own rule tests: 900 MiB that no claim accounts for
    on a GPU with two processes stays within their 2 x 512 MiB of context overhead; 3 GiB fires
    after the rule's minute, naming the GPU."""
    labels = 'node="n1", device_uuid="GPU-1", device_index="0", model="Sim H100"'
    tests = tmp_path / "unaccounted-test.yaml"
    tests.write_text(
        textwrap.dedent(
            f"""\
            rule_files:
              - {RULES_FILE}
            evaluation_interval: 1m
            tests:
              - interval: 1m
                input_series:
                  - series: 'tessera_gpu_memory_unaccounted_bytes{{{labels}}}'
                    values: '943718400x4 3221225472x6'
                  - series: 'tessera_gpu_processes{{{labels}}}'
                    values: '2x10'
                alert_rule_test:
                  - eval_time: 4m
                    alertname: TesseraGpuMemoryUnaccounted
                    exp_alerts: []
                  - eval_time: 5m
                    alertname: TesseraGpuMemoryUnaccounted
                    exp_alerts: []
                  - eval_time: 7m
                    alertname: TesseraGpuMemoryUnaccounted
                    exp_alerts:
                      - exp_labels:
                          severity: warning
                          node: n1
                          device_uuid: GPU-1
                          device_index: "0"
                          model: Sim H100
                        exp_annotations:
                          summary: GPU 0 on n1 holds memory that no claim accounts for
                          description: >-
                            3GiB on GPU GPU-1 (Sim H100) of node n1 is held by processes outside
                            every claim on it, or by a claim's processes past its limit;
                            tessera_container_gpu_memory_excess_bytes names the container, and the
                            exporter's log names the process.
            """
        )
    )
    done = promtool("test", "rules", str(tests))
    assert done.returncode == 0, done.stdout + done.stderr


def test_promtool_fires_the_compute_over_cap_alert_only_past_the_tolerance_for_five_minutes(
    tmp_path: Path,
) -> None:
    """The shipped rule evaluated by promtool's own rule tests: a claim's processes sampled 0.1 past
    its cap stay within the tolerance; 0.3 past it fires once it has held for five minutes, naming
    the container."""
    labels = (
        'namespace="team-a", pod="p", container="main", claim="c", node="n1", device_uuid="GPU-1", '
        'device_index="0"'
    )
    tests = tmp_path / "compute-test.yaml"
    tests.write_text(
        textwrap.dedent(
            f"""\
            rule_files:
              - {RULES_FILE}
            evaluation_interval: 1m
            tests:
              - interval: 1m
                input_series:
                  - series: 'tessera_container_gpu_utilization_excess_ratio{{{labels}}}'
                    values: '0.1x9 0.3x10'
                alert_rule_test:
                  - eval_time: 9m
                    alertname: TesseraContainerGpuComputeOverCap
                    exp_alerts: []
                  - eval_time: 14m
                    alertname: TesseraContainerGpuComputeOverCap
                    exp_alerts: []
                  - eval_time: 15m
                    alertname: TesseraContainerGpuComputeOverCap
                    exp_alerts:
                      - exp_labels:
                          severity: warning
                          namespace: team-a
                          pod: p
                          container: main
                          claim: c
                          node: n1
                          device_uuid: GPU-1
                          device_index: "0"
                        exp_annotations:
                          summary: Container team-a/p/main uses more GPU time than its compute cap
                          description: >-
                            The processes of claim c kept GPU 0 (GPU-1) of node n1 busy 30% of the
                            time past the claim's compute cap, by the driver's per-process samples,
                            for 5 minutes: compute taken around the shim.
            """
        )
    )
    done = promtool("test", "rules", str(tests))
    assert done.returncode == 0, done.stdout + done.stderr
