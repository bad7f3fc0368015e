"""The exporter's NVML under its watchdog: a GPU whose NVML call hangs (a wedged driver) loses only
its own series, reads unhealthy and is counted; scrapes go on and start no more stuck threads; the
exporter's liveness fails once the call has been hung past its bound, and recovers when it returns.
A GPU already hung at start is left out without failing liveness, and joins once it answers.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from tessera.driver.discovery import Gpu, GpuSample
from tessera.exporter.collector import GpuCollector, Sources
from tessera.exporter.metrics import DaemonMetrics
from tessera.exporter.watched_nvml import NvmlNotAnswering, WatchedNvml, initialised
from tessera.watchdog import Hung
from testbed.polling import poll_until
from tests.unit.driver.driver_samples import gpu
from tests.unit.exporter.test_exporter import Series, gpu_labels, sample, values

GPUS = [gpu(0), gpu(1)]
NODE = {"node": "node-a"}


class WedgingNvml:
    """NVML of two GPUs; while ``wedged`` is set, every call on GPU 0 blocks until ``released``."""

    def __init__(self) -> None:
        self.wedged = threading.Event()
        self.released = threading.Event()
        self.calls_on_0 = 0

    def _touch(self, uuid: str) -> None:
        if uuid == GPUS[0].uuid:
            self.calls_on_0 += 1
            if self.wedged.is_set():
                self.released.wait()

    def sample(self, uuid: str) -> GpuSample:
        self._touch(uuid)
        return sample()

    def problem(self, uuid: str) -> str | None:
        self._touch(uuid)
        return None

    def compute_memory(self, uuid: str) -> dict[int, int | None] | None:
        self._touch(uuid)
        return {}

    def gpu_count(self) -> int:
        return len(GPUS)

    def gpu_at(self, index: int) -> Gpu:
        self._touch(GPUS[index].uuid)
        return GPUS[index]


class Exporter:
    """The collector over WatchedNvml, as tessera/exporter/cli.py wires them."""

    def __init__(self, tmp_path: Path, restart_after: float, nvml: WedgingNvml | None = None) -> None:
        self.nvml = nvml or WedgingNvml()
        self.watched = WatchedNvml(self.nvml, timeout=0.2, restart_after=restart_after)
        self.watched.discover()
        metrics = DaemonMetrics("node-a")
        metrics.nvml_hung.set_function(self.watched.hung)
        self.registry = CollectorRegistry()
        self.registry.register(
            GpuCollector(
                Sources(
                    node="node-a",
                    claims_dir=tmp_path,
                    gpus=self.watched.gpus,
                    sample=self.watched.sample,
                    problems=self.watched.problems,
                    records=dict,
                    containers=lambda ns, name: [],
                    container=lambda pod_uid, container_id: None,
                    proc=tmp_path,
                ),
                metrics,
            )
        )

    def scrape(self) -> Series:
        out: Series = {}
        for family in text_string_to_metric_families(generate_latest(self.registry).decode()):
            for s in family.samples:
                out[(s.name, frozenset(s.labels.items()))] = s.value
        return out


@pytest.fixture
def exporter(tmp_path: Path) -> Iterator[Exporter]:
    made = Exporter(tmp_path, restart_after=0.5)
    yield made
    made.nvml.released.set()


def node_value(series: Series, name: str, **labels: str) -> float:
    return series[(name, frozenset({**NODE, **labels}.items()))]


def test_a_gpu_whose_nvml_hangs_loses_its_series_and_reads_unhealthy_while_the_other_keeps_its_own(
    exporter: Exporter,
) -> None:
    g0, g1 = GPUS
    before = exporter.scrape()
    assert set(values(before, "tessera_gpu_memory_used_bytes")) == {gpu_labels(g0), gpu_labels(g1)}
    assert node_value(before, "tessera_exporter_nvml_hung_gpus") == 0

    exporter.nvml.calls_on_0 = 0
    exporter.nvml.wedged.set()
    for scrape in range(1, 4):
        series = exporter.scrape()
        assert set(values(series, "tessera_gpu_memory_used_bytes")) == {gpu_labels(g1)}
        assert values(series, "tessera_gpu_healthy") == {gpu_labels(g0): 0, gpu_labels(g1): 1}
        assert node_value(series, "tessera_exporter_nvml_hung_gpus") == 1
        assert node_value(series, "tessera_exporter_scrape_errors_total", source="nvml") == scrape
    assert exporter.nvml.calls_on_0 == 1, "one stuck call on the GPU, however many scrapes"

    exporter.nvml.wedged.clear()
    exporter.nvml.released.set()
    poll_until(lambda: exporter.watched.hung() == 0, 30, "the hung call to return")
    after = exporter.scrape()
    assert set(values(after, "tessera_gpu_memory_used_bytes")) == {gpu_labels(g0), gpu_labels(g1)}
    assert values(after, "tessera_gpu_healthy") == {gpu_labels(g0): 1, gpu_labels(g1): 1}


def test_liveness_fails_once_a_call_is_hung_past_the_bound_and_recovers_when_it_returns(
    exporter: Exporter,
) -> None:
    assert exporter.watched.alive() == (True, "ok")
    exporter.nvml.wedged.set()
    exporter.scrape()
    assert exporter.watched.alive()[0], "hung, but not yet past the bound"
    poll_until(lambda: not exporter.watched.alive()[0], 30, "liveness to fail after the bound")
    reason = exporter.watched.alive()[1]
    assert reason.startswith("an NVML call has not returned for over 0.5 s on GPU " + GPUS[0].uuid)

    exporter.nvml.wedged.clear()
    exporter.nvml.released.set()
    poll_until(lambda: exporter.watched.alive()[0], 30, "liveness to recover")


def test_the_bypass_loops_process_list_of_a_hung_gpu_fails_at_once_without_a_new_call(
    exporter: Exporter,
) -> None:
    exporter.nvml.wedged.set()
    exporter.scrape()
    calls = exporter.nvml.calls_on_0
    with pytest.raises(Hung):
        exporter.watched.compute_memory(GPUS[0].uuid)
    assert exporter.nvml.calls_on_0 == calls, "no new call on the hung GPU"
    assert exporter.watched.compute_memory(GPUS[1].uuid) == {}


def test_concurrent_scrapes_each_get_every_series(exporter: Exporter) -> None:
    results: list[Series] = []
    lock = threading.Lock()

    def scrape() -> None:
        found = exporter.scrape()
        with lock:
            results.append(found)

    threads = [threading.Thread(target=scrape) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    assert len(results) == 8
    for series in results:
        assert set(values(series, "tessera_gpu_memory_used_bytes")) == {gpu_labels(g) for g in GPUS}


def test_a_restart_bound_below_the_timeout_is_refused() -> None:
    with pytest.raises(ValueError, match="at least its timeout"):
        WatchedNvml(WedgingNvml(), timeout=2.0, restart_after=1.0)


def test_an_nvml_that_never_initialises_fails_the_start_with_a_sentence_after_the_bound() -> None:
    """A driver wedged for every GPU: the exporter must exit and say why, not hang unseen."""
    wedged = threading.Event()
    with pytest.raises(NvmlNotAnswering, match=r"NVML did not initialise within 0.2 s .*kubelet restarts"):
        initialised(wedged.wait, restart_after=0.2)
    wedged.set()
    assert initialised(lambda: "nvml", restart_after=0.2) == "nvml", "an init that returns is handed back"


def test_a_gpu_count_that_hangs_fails_discovery_with_a_sentence_after_the_restart_bound() -> None:
    nvml = WedgingNvml()
    counting = threading.Event()

    def count() -> int:
        counting.wait()
        return len(GPUS)

    nvml.gpu_count = count  # type: ignore[method-assign]
    watched = WatchedNvml(nvml, timeout=0.1, restart_after=0.3)
    with pytest.raises(NvmlNotAnswering, match=r"NVML did not count the GPUs within 0.3 s"):
        watched.discover()
    counting.set()


def test_a_gpu_hung_at_start_is_left_out_without_failing_liveness_and_joins_once_it_answers(
    tmp_path: Path,
) -> None:
    """A restart that finds the GPU still hung must not restart again and again: the other GPU is
    served, the hung one counted, liveness stays green past the bound; once the GPU answers, its
    series join in the same process."""
    nvml = WedgingNvml()
    nvml.wedged.set()
    exporter = Exporter(tmp_path, restart_after=0.3, nvml=nvml)
    try:
        assert exporter.watched.gpus() == [GPUS[1]]
        series = exporter.scrape()
        assert set(values(series, "tessera_gpu_memory_used_bytes")) == {gpu_labels(GPUS[1])}
        assert node_value(series, "tessera_exporter_nvml_hung_gpus") == 1
        time.sleep(0.6)  # twice the restart bound
        assert exporter.watched.alive() == (True, "ok"), "a GPU hung since start does not fail liveness"
    finally:
        nvml.wedged.clear()
        nvml.released.set()
    poll_until(lambda: exporter.watched.hung() == 0, 30, "the hung call to return")
    after = exporter.scrape()
    assert set(values(after, "tessera_gpu_memory_used_bytes")) == {gpu_labels(GPUS[0]), gpu_labels(GPUS[1])}
    assert exporter.watched.gpus() == GPUS, "in index order"
    assert exporter.watched.alive() == (True, "ok")
