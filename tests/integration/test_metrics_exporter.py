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
import re
import secrets
import signal
import subprocess
import textwrap
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client
from prometheus_client.parser import text_string_to_metric_families

from simgpu.config import library_dir, process_env
from tessera.exporter.collector import FAMILIES
from tessera.quantity import GiB
from tessera.shim._format import ffi as _ffi
from tessera.shim._format import lib as _lib
from tessera.shim.format import MAX_GPUS, GpuLimit, read_limits
from tessera.shim.install import install
from tessera.webview import usage_history
from tessera.webview.usage_history import polyline
from testbed.cluster import LocalCluster
from testbed.driver_node import DriverNode, ensure_device_class
from testbed.kubelet_client import KubeletClient
from testbed.node_host import cgroup_mounts, remove_cgroup_tree
from testbed.polling import poll_until
from testbed.prometheus import RULES_FILE, TEST_HOLD, Prometheus, Sample, promtool
from testbed.share_pods import share_pod
from testbed.shim_harness import (
    PROGRAM_BUILD,
    SIMGPU_BUILD,
    Claim,
    build_programs,
    build_shim,
    build_simgpu,
    values,
)

pytestmark = pytest.mark.integration

USED = "tessera_container_gpu_memory_used_bytes"
LIMIT = "tessera_container_gpu_memory_limit_bytes"
DRIVER = "tessera_container_gpu_memory_driver_bytes"
EXCESS = "tessera_container_gpu_memory_excess_bytes"
UNACCOUNTED = "tessera_gpu_memory_unaccounted_bytes"


@dataclass
class Bed:
    node: DriverNode
    scraper: Prometheus | None
    """None for a bed whose tests read the exporter and the API server only."""
    programs: Path

    @property
    def prometheus(self) -> Prometheus:
        assert self.scraper is not None, "this bed runs no Prometheus"
        return self.scraper

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


@contextlib.contextmanager
def node_bed(
    cluster: LocalCluster,
    kube: client.ApiClient,
    fake_node: Callable[..., str],
    exporter_args: list[str],
    scraped: bool = True,
) -> Iterator[Bed]:
    build_shim()
    build_simgpu()
    programs = build_programs(PROGRAM_BUILD, SIMGPU_BUILD)
    ensure_device_class(kube)
    node = DriverNode(cluster, fake_node(), gpus=2, memory_bytes=16 * GiB, exporter_args=exporter_args)
    node.start()
    node.wait_published()
    prometheus = (
        Prometheus([f"{node.metrics_address}:{node.metrics_port}"], hold=TEST_HOLD) if scraped else None
    )
    try:
        yield Bed(node, prometheus, programs)
    finally:
        if prometheus is not None:
            prometheus.stop()
        node.cleanup()


@pytest.fixture
def bed(cluster: LocalCluster, kube: client.ApiClient, fake_node: Callable[..., str]) -> Iterator[Bed]:
    """A node whose exporter runs with the chart's defaults."""
    with node_bed(cluster, kube, fake_node, []) as made:
        yield made


@pytest.fixture
def default_bed(
    cluster: LocalCluster, kube: client.ApiClient, fake_node: Callable[..., str]
) -> Iterator[Bed]:
    """A node whose exporter runs with the chart's defaults, and no Prometheus."""
    with node_bed(cluster, kube, fake_node, [], scraped=False) as made:
        yield made


# The simulated driver charges no per-context overhead: a tolerance well under what the tests take.
TOLERANCE = ["--bypass-tolerance=64Mi"]


@pytest.fixture
def reporting_bed(
    cluster: LocalCluster, kube: client.ApiClient, fake_node: Callable[..., str]
) -> Iterator[Bed]:
    """A node whose exporter only reports memory taken around the shim (it stops nothing)."""
    with node_bed(cluster, kube, fake_node, ["--bypass-action=report", *TOLERANCE]) as made:
        yield made


@pytest.fixture
def unscraped_reporting_bed(
    cluster: LocalCluster, kube: client.ApiClient, fake_node: Callable[..., str]
) -> Iterator[Bed]:
    """The same, and no Prometheus."""
    with node_bed(cluster, kube, fake_node, ["--bypass-action=report", *TOLERANCE], scraped=False) as made:
        yield made


@pytest.fixture
def stopping_bed(
    cluster: LocalCluster, kube: client.ApiClient, fake_node: Callable[..., str]
) -> Iterator[Bed]:
    """A node whose exporter stops memory taken around the shim (the default action); no Prometheus."""
    with node_bed(cluster, kube, fake_node, ["--bypass-action=stop", *TOLERANCE], scraped=False) as made:
        yield made


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


def hold(claim: Claim, nbytes: int, around: bool = False) -> subprocess.Popen[str]:
    """A process of the claim that allocates ``nbytes`` and holds them until its stdin closes;
    ``around``: one that reaches the driver without the shim (no preload: the real library by its
    path), which the shim never charges."""
    process = claim.start(
        "shim_probe", "alloc", "mem", str(nbytes), "hold", env={"LD_PRELOAD": ""} if around else None
    )
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
    # Utilisation needs one process sample or two scrapes (its excess, a process sample); every
    # other family is there at once.
    sampled = {"tessera_container_gpu_utilization_ratio", "tessera_container_gpu_utilization_excess_ratio"}
    assert set(FAMILIES) - sampled <= names
    # Prometheus loaded the shipped rules (each held for TEST_HOLD) and scrapes the node.
    shipped = yaml.safe_load(RULES_FILE.read_text())
    loaded = [rule for group in bed.prometheus.rule_groups() for rule in group["rules"]]
    assert sorted(rule["name"] for rule in loaded) == sorted(
        rule["alert"] for group in shipped["groups"] for rule in group["rules"]
    )
    assert {rule["duration"] for rule in loaded} == {5}, "TEST_HOLD"
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

        # The rule's `for:` (TEST_HOLD here; promtool checks the shipped minute) holds it pending first.
        alert = poll_until(firing, 150, "TesseraContainerGpuMemoryNearLimit firing", interval=1.0)
    finally:
        assert process.stdin is not None
        process.stdin.close()
        process.wait(timeout=60)
    assert alert["labels"]["namespace"] == namespace
    assert alert["labels"]["container"] == "main"
    assert float(alert["value"]) == pytest.approx(950 / 1024, abs=0.001)


def test_the_web_views_usage_history_is_the_shares_memory_as_the_real_prometheus_has_it(
    bed: Bed, kube: client.ApiClient, namespace: str, tmp_path: Path
) -> None:
    """tessera-webview's one range query, against the Prometheus that scrapes the node's exporter:
    the pod's series, with the memory its process holds."""
    _, claim, uid = share_pod(kube, namespace, bed.node.node_name, "p", memory="1Gi")
    proc = prepared_claim(bed, namespace, claim, uid, tmp_path)
    process = hold(proc, 512 * 1024 * 1024)
    try:

        def holding() -> Sequence[tuple[float, float]] | None:
            series = usage_history.read(f"http://127.0.0.1:{bed.prometheus.port}").get((namespace, "p"))
            return series if series and series[-1][1] == 512 * 1024 * 1024 else None

        series = poll_until(holding, 60, "the pod's memory in the web view's usage history", interval=1.0)
    finally:
        assert process.stdin is not None
        process.stdin.close()
        process.wait(timeout=60)
    assert all(0 <= value <= 512 * 1024 * 1024 for _, value in series)
    assert polyline(series, 1024 * 1024 * 1024).endswith(",12.0"), "half the limit: half the height"


def test_a_process_that_bypasses_the_shim_shows_as_its_containers_excess_and_fires_the_alert(
    reporting_bed: Bed, kube: client.ApiClient, namespace: str, tmp_path: Path
) -> None:
    """A process of the container that reaches the driver without the shim (no preload: the real
    library by its path) allocates past the claim: the shim charged nothing for it, the driver
    reports it all, and the excess names the container, is memory the GPU has that no claim accounts
    for, is logged once naming the container, and fires TesseraGpuMemoryUnaccounted. (The exporter
    only reports here, so that the process lives through the alert's hold.)"""
    bed = reporting_bed
    _, claim, uid = share_pod(kube, namespace, bed.node.node_name, "p", memory="1Gi")
    proc = prepared_claim(bed, namespace, claim, uid, tmp_path)
    with in_container(kube, namespace, "p"):
        shimmed = hold(proc, 512 * 1024 * 1024)
        bypass = hold(proc, 3 * GiB, around=True)
        try:
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

            # The rule's `for:` (TEST_HOLD here; promtool checks the shipped minute) holds it pending first.
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


def test_promtool_fires_the_memory_near_limit_alert_only_after_its_minute_past_90_percent(
    tmp_path: Path,
) -> None:
    """The shipped rule evaluated by promtool's own rule tests (the live tests shorten its hold): a
    container at 89 % of its limit never fires; at 95 % from 2m15s it is still pending at 3m (45 s
    held) and fires at 3m15s, once the rule's minute has passed, naming the container."""
    labels = (
        'namespace="team-a", pod="p", container="main", claim="c", node="n1", device_uuid="GPU-1", '
        'device_index="0"'
    )
    tests = tmp_path / "near-limit-test.yaml"
    tests.write_text(
        textwrap.dedent(
            f"""\
            rule_files:
              - {RULES_FILE}
            evaluation_interval: 15s
            tests:
              - interval: 15s
                input_series:
                  - series: 'tessera_container_gpu_memory_limit_bytes{{{labels}}}'
                    values: '100x20'
                  - series: 'tessera_container_gpu_memory_used_bytes{{{labels}}}'
                    values: '89x8 95x12'
                alert_rule_test:
                  - eval_time: 2m
                    alertname: TesseraContainerGpuMemoryNearLimit
                    exp_alerts: []
                  - eval_time: 3m
                    alertname: TesseraContainerGpuMemoryNearLimit
                    exp_alerts: []
                  - eval_time: 3m15s
                    alertname: TesseraContainerGpuMemoryNearLimit
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
                          summary: Container team-a/p/main uses over 90 % of its GPU memory limit
                          description: >-
                            Claim c holds 95% of its memory limit on GPU 0 (GPU-1) of node n1;
                            allocations past the limit will fail with CUDA_ERROR_OUT_OF_MEMORY.
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


BOUND = 2.0
"""The exporter's default --bypass-bound, which these beds keep."""


def pod_events(kube: client.ApiClient, namespace: str, pod: str, reason: str) -> list[client.CoreV1Event]:
    """The Events with ``reason`` on pod ``namespace/pod`` (by its UID, as involvedObject names it)."""
    core = client.CoreV1Api(kube)
    metadata = core.read_namespaced_pod(pod, namespace).metadata
    assert metadata is not None
    selector = f"involvedObject.uid={metadata.uid},reason={reason}"
    return list(core.list_namespaced_event(namespace, field_selector=selector).items)


def one_event(kube: client.ApiClient, namespace: str, pod: str, reason: str) -> client.CoreV1Event:
    def written() -> tuple[client.CoreV1Event] | None:
        found = pod_events(kube, namespace, pod, reason)
        return (found[0],) if found else None

    return poll_until(written, 30, f"an Event {reason} on pod {namespace}/{pod}")[0]


def held_for(message: str) -> float:
    """The seconds an Event's sentence says the offence held before it was acted on."""
    match = re.search(r", for ([0-9.]+) s: ", message)
    assert match, message
    return float(match.group(1))


def zero_charge(region: Path, pid: int) -> None:
    """What any process of the claim can do to its usage region (mapped read-write in its
    containers): zero the charge of process ``pid`` on every GPU."""
    handle = _ffi.new("struct tessera_region_handle *")
    assert _lib.tessera_region_open(str(region).encode(), handle, _ffi.NULL, 0) == 0
    try:
        slots = [i for i in range(handle.map.slot_hwm) if handle.map.slots[i].pid == pid]
        assert len(slots) == 1, slots
        for g in range(MAX_GPUS):
            handle.map.slots[slots[0]].used[g] = 0
    finally:
        _lib.tessera_region_close(handle)


def test_a_process_holding_memory_around_the_shim_past_its_claim_is_stopped_within_the_bound(
    stopping_bed: Bed, kube: client.ApiClient, namespace: str, tmp_path: Path
) -> None:
    """A container's process takes 3 GiB under a 1 GiB claim without the shim (the real driver
    library by its path): the exporter SIGKILLs it once the offence has held for the bound, the
    container's process that went through the shim keeps running, and the pod gets a Warning Event
    saying which process, how much past what, and for how long; the exporter's log says the same."""
    bed = stopping_bed
    _, claim, uid = share_pod(kube, namespace, bed.node.node_name, "p", memory="1Gi")
    proc = prepared_claim(bed, namespace, claim, uid, tmp_path)
    with in_container(kube, namespace, "p"):
        shimmed = hold(proc, 512 * 1024 * 1024)
        try:
            bypass = hold(proc, 3 * GiB, around=True)
            held_from = time.monotonic()
            assert bypass.wait(timeout=30) == -signal.SIGKILL
            lived = time.monotonic() - held_from
            assert shimmed.poll() is None
        finally:
            shimmed.kill()
            shimmed.wait(timeout=60)
    event = one_event(kube, namespace, "p", "GpuMemoryBypassStopped")
    assert event.type == "Warning"
    assert event.message is not None
    assert event.message.startswith(
        f"Process {bypass.pid} (shim_probe) of container main held 3072 MiB on GPU "
    )
    assert f"3072 MiB past what claim {namespace}/{claim}'s usage region charges it (0 MiB)" in event.message
    assert event.message.endswith(": stopped (SIGKILL).")
    # The loop's own account: the offence held at every check for the bound before it acted.
    assert held_for(event.message) >= BOUND, event.message
    print(f"\nthe bypassing process lived {lived:.2f} s after it held its memory; the Event: {event.message}")
    logged = exporter_log(bed, "GpuMemoryBypassStopped")
    assert len(logged) == 1 and event.message in logged[0], logged
    stopped = [
        s.value
        for f in text_string_to_metric_families(bed.node.scrape())
        for s in f.samples
        if s.name == "tessera_exporter_bypass_stopped_total" and s.labels["reason"] == "uncharged"
    ]
    assert stopped == [1]


def test_zeroed_counters_and_a_second_process_the_one_hiding_its_memory_is_stopped_the_other_lives(
    default_bed: Bed, kube: client.ApiClient, namespace: str, tmp_path: Path
) -> None:
    """Both processes go through the shim: the first holds 1000 MiB of a 1 GiB claim, its charge is
    zeroed in the usage region, and the shim then lets a second take 1000 MiB more. With the
    chart's defaults (stop, 512 MiB a process) the claim's 976 MiB past its limit is within the
    tolerance of its two processes, but the first holds 1000 MiB that the region charges no one:
    it alone is stopped, and the second, charged for what it holds, keeps its memory and runs on."""
    bed = default_bed
    _, claim, uid = share_pod(kube, namespace, bed.node.node_name, "p", memory="1Gi")
    proc = prepared_claim(bed, namespace, claim, uid, tmp_path)
    with in_container(kube, namespace, "p"):
        first = hold(proc, 1000 * 1024 * 1024)
        second: subprocess.Popen[str] | None = None
        try:
            assert proc.region is not None
            zero_charge(proc.region, first.pid)
            second = hold(proc, 1000 * 1024 * 1024)
            assert first.wait(timeout=30) == -signal.SIGKILL
            event = one_event(kube, namespace, "p", "GpuMemoryBypassStopped")
            assert second.poll() is None
        finally:
            for process in (first, second):
                if process is not None:
                    process.kill()
                    process.wait(timeout=60)
    assert event.message is not None
    assert event.message.startswith(f"Process {first.pid} (shim_probe) of container main held 1000 MiB")
    assert "1000 MiB past what claim" in event.message and "charges it (0 MiB)" in event.message
    assert len(pod_events(kube, namespace, "p", "GpuMemoryBypassStopped")) == 1


def test_in_report_mode_nobody_is_stopped_and_the_pod_gets_one_warning_event_per_episode(
    unscraped_reporting_bed: Bed, kube: client.ApiClient, namespace: str, tmp_path: Path
) -> None:
    bed = unscraped_reporting_bed
    _, claim, uid = share_pod(kube, namespace, bed.node.node_name, "p", memory="1Gi")
    proc = prepared_claim(bed, namespace, claim, uid, tmp_path)
    with in_container(kube, namespace, "p"):
        bypass = hold(proc, 2 * GiB, around=True)
        try:
            event = one_event(kube, namespace, "p", "GpuMemoryBypassDetected")
            after = bypass_checks(bed)

            def eight_more() -> bool | None:
                return bypass_checks(bed) >= after + 8 or None

            # Many more checks find the same offence: still one Event, and the process runs on.
            poll_until(eight_more, 30, "eight more checks")
            assert bypass.poll() is None
            assert len(pod_events(kube, namespace, "p", "GpuMemoryBypassDetected")) == 1
            assert pod_events(kube, namespace, "p", "GpuMemoryBypassStopped") == []
        finally:
            bypass.kill()
            bypass.wait(timeout=60)
    assert event.type == "Warning" and event.message is not None
    assert event.message.startswith(f"Process {bypass.pid} (shim_probe) of container main held 2048 MiB")
    assert event.message.endswith(": reported only (bypass action: report).")
    logged = exporter_log(bed, "GpuMemoryBypassDetected")
    assert len(logged) == 1 and event.message in logged[0], logged


def bypass_checks(bed: Bed) -> int:
    """The exporter's count of bypass checks now."""
    for family in text_string_to_metric_families(bed.node.scrape()):
        for s in family.samples:
            if s.name == "tessera_exporter_bypass_checks_total":
                return int(s.value)
    raise AssertionError("no tessera_exporter_bypass_checks_total in the scrape")


def exporter_log(bed: Bed, word: str) -> list[str]:
    """The exporter's log lines (every start's) that contain ``word``."""
    return [
        line
        for log in bed.node.work_dir.glob("tessera-exporter-*.log")
        for line in log.read_text().splitlines()
        if word in line
    ]
