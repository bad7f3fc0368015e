"""The bypass loop end to end on one node's readings, with real processes: a claim's real usage
region whose slots are held by real processes (the shim's record locks), NVML's process list given
by the test, and a /proc whose cgroup files place those real processes in a pod's container (the
rest of each process's /proc entry copied from the real one). What is stopped is stopped for real,
by pidfd; the Events and the loop's counters are read back."""

from __future__ import annotations

import logging
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from tessera.driver.discovery import GpuSample
from tessera.exporter import procs
from tessera.exporter.bypass_loop import DETECTED, REPORT, STOP, STOPPED, BypassLoop, BypassSettings
from tessera.exporter.collector import Sources
from tessera.exporter.containers import ContainerRef
from tessera.exporter.metrics import DaemonMetrics
from tessera.exporter.reading import Placed
from tessera.quantity import GiB, MiB
from tessera.shim import format as shim_format
from testbed.polling import poll_until
from tests.unit.driver.driver_samples import gpu
from tests.unit.driver.test_region_reader import UUID, hold
from tests.unit.exporter.test_exporter import ids_of, write_claim

MAIN = ContainerRef("ns", "p1", "main")
OTHER_GPU = "GPU-00000000-0000-0000-0000-0000000000ff"
"""A GPU of the node that claim c1 has no share of."""


@dataclass
class Bed:
    tmp_path: Path
    action: str = STOP
    listed: dict[int, int | None] = field(default_factory=dict)
    elsewhere: dict[int, int | None] = field(default_factory=dict)
    """NVML's processes on OTHER_GPU."""
    now: float = 100.0
    events: list[tuple[Placed, str, str, str]] = field(default_factory=list)
    refused: OSError | None = None
    started: list[subprocess.Popen[str]] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.proc = self.tmp_path / "proc"
        self.proc.mkdir()
        claims = self.tmp_path / "claims"
        folder = write_claim(claims, "u1", "c1", [shim_format.GpuLimit(UUID, GiB, 0)])
        self.region = folder / "usage"
        self.metrics = DaemonMetrics("node-a")
        pod_uid, container_id = ids_of(MAIN)
        sources = Sources(
            node="node-a",
            claims_dir=claims,
            gpus=lambda: [gpu(0, uuid=UUID), gpu(1, uuid=OTHER_GPU)],
            sample=lambda uuid: GpuSample(
                None, None, None, None, None, None, self.listed if uuid == UUID else self.elsewhere
            ),
            problems=dict,
            records=dict,
            containers=lambda ns, name: [MAIN] if (ns, name) == ("ns", "c1") else [],
            container=lambda p, c: MAIN if (p, c) == (pod_uid, container_id) else None,
            proc=self.proc,
            clock=lambda: self.now,
        )
        settings = BypassSettings(self.action, 64 * MiB, 2.0, 0.25)
        self.loop = BypassLoop(sources, settings, self.metrics, self.emit, self.stop_process)

    def emit(self, placed: Placed, type_: str, reason: str, message: str) -> None:
        self.events.append((placed, type_, reason, message))

    def stop_process(self, pid: int, still_the_one: Callable[[], bool]) -> bool:
        if self.refused is not None:
            raise self.refused
        return procs.kill(pid, still_the_one)

    def in_container(self, process: subprocess.Popen[str], holds: int) -> subprocess.Popen[str]:
        """``process`` placed in container ns/p1/main (its cgroup as the kubelet's cgroupfs driver
        lays it out), the driver saying it holds ``holds`` bytes on the GPU."""
        folder = self.proc / str(process.pid)
        folder.mkdir()
        for name in ("stat", "status", "comm"):
            (folder / name).write_bytes(Path(f"/proc/{process.pid}/{name}").read_bytes())
        pod_uid, container_id = ids_of(MAIN)
        (folder / "cgroup").write_text(f"0::/kubepods/besteffort/pod{pod_uid}/{container_id}\n")
        self.listed[process.pid] = holds
        self.started.append(process)
        return process

    def shimmed(self, charged: int, holds: int) -> subprocess.Popen[str]:
        """A process of the claim holding a region slot charged ``charged`` bytes."""
        return self.in_container(hold(self.region, charged), holds)

    def around(self, holds: int) -> subprocess.Popen[str]:
        """A process of the claim with no slot: the shim never saw it."""
        process = subprocess.Popen(
            [sys.executable, "-c", "import sys; sys.stdin.read()"], stdin=subprocess.PIPE, text=True
        )
        return self.in_container(process, holds)

    def checks(self, *times: float) -> None:
        for t in times:
            self.now = t
            self.loop.check()


@pytest.fixture
def make_bed(tmp_path: Path) -> Iterator[Callable[..., Bed]]:
    made: list[Bed] = []

    def make(action: str = STOP) -> Bed:
        made.append(Bed(tmp_path, action))
        return made[-1]

    yield make
    for bed in made:
        for process in bed.started:
            process.kill()
            process.wait(timeout=10)


def test_a_process_holding_memory_the_region_does_not_charge_is_stopped_once_the_bound_has_passed(
    make_bed: Callable[..., Bed],
) -> None:
    """The claim is within its 1 GiB by the region's count, but the driver counts 600 MiB more for a
    process with no slot: after 2 s of checks that all find it, it is SIGKILLed and its pod gets one
    Event; the shimmed process of the same container lives."""
    bed = make_bed()
    shimmed = bed.shimmed(300 * MiB, 300 * MiB)
    bypass = bed.around(600 * MiB)
    bed.checks(100.0, 101.0, 101.75)
    assert bypass.poll() is None and bed.events == []
    bed.checks(102.0)
    assert bypass.wait(timeout=10) == -9
    assert shimmed.poll() is None
    ((placed, type_, reason, message),) = bed.events
    assert (placed.ref, type_, reason) == (MAIN, "Warning", STOPPED)
    command = (bed.proc / str(bypass.pid) / "comm").read_text().strip()
    assert message == (
        f"Process {bypass.pid} ({command}) of container main held 600 MiB on GPU {UUID}, 600 MiB past "
        "what claim ns/c1's usage region charges it (0 MiB), for 2.0 s: stopped (SIGKILL)."
    )
    # NVML may list a killed process for a moment: no second stop, no second Event.
    bed.checks(102.25)
    assert len(bed.events) == 1
    assert bed.metrics.bypass_stopped["uncharged"]._value.get() == 1
    assert bed.metrics.bypass_stopped["over_limit"]._value.get() == 0
    assert bed.metrics.bypass_checks._value.get() == 5


def test_zeroed_counters_let_a_second_process_allocate_and_only_the_one_whose_charge_was_erased_goes(
    make_bed: Callable[..., Bed],
) -> None:
    """The first process holds 1 GiB, its slot reads 0 (zeroed), a second allocated 1 GiB through
    the shim and is charged for it: the first is stopped, the second keeps running."""
    bed = make_bed()
    erased = bed.shimmed(0, GiB)
    charged = bed.shimmed(GiB, GiB)
    bed.checks(100.0, 102.0)
    assert erased.wait(timeout=10) == -9
    assert charged.poll() is None
    (event,) = bed.events
    assert event[2] == STOPPED and f"Process {erased.pid} " in event[3]


def test_memory_on_a_gpu_the_claim_has_no_share_of_is_stopped_like_memory_around_the_shim(
    make_bed: Callable[..., Bed],
) -> None:
    """A process of the claim's container holds 600 MiB on the node's other GPU (its
    CUDA_VISIBLE_DEVICES unset, the shim left out, which gives that GPU nothing): after the bound it
    is stopped, its Event naming the GPU as one the claim has no share of."""
    bed = make_bed()
    process = bed.around(0)
    del bed.listed[process.pid]
    bed.elsewhere[process.pid] = 600 * MiB
    bed.checks(100.0, 101.0)
    assert process.poll() is None and bed.events == []
    bed.checks(102.0)
    assert process.wait(timeout=10) == -9
    ((placed, _, reason, message),) = bed.events
    assert (placed.ref, reason) == (MAIN, STOPPED)
    assert f"held 600 MiB on GPU {OTHER_GPU}, which claim ns/c1 has no share of, for 2.0 s" in message


def test_in_report_mode_nothing_is_stopped_and_each_episode_is_reported_once(
    make_bed: Callable[..., Bed],
) -> None:
    bed = make_bed(REPORT)
    bypass = bed.around(600 * MiB)
    bed.checks(100.0, 102.0, 103.0, 110.0)
    assert bypass.poll() is None
    ((_, type_, reason, message),) = bed.events
    assert (type_, reason) == ("Warning", DETECTED)
    assert message.endswith("for 2.0 s: reported only (bypass action: report).")
    assert bed.metrics.bypass_reported["uncharged"]._value.get() == 1
    # It frees its memory, then takes it again: a new episode, reported again after the bound.
    bed.listed[bypass.pid] = 0
    bed.checks(111.0)
    bed.listed[bypass.pid] = 600 * MiB
    bed.checks(112.0, 113.0, 114.0)
    assert [e[2] for e in bed.events] == [DETECTED, DETECTED]
    assert bed.metrics.bypass_stopped["uncharged"]._value.get() == 0


def test_a_process_that_is_no_longer_in_the_container_it_was_judged_in_is_not_signalled(
    make_bed: Callable[..., Bed],
) -> None:
    """Between the judgement and the signal the pid names another process (here: its cgroup now
    says no pod's container): the pinned process is checked again and left alone."""
    bed = make_bed()
    bypass = bed.around(600 * MiB)
    bed.checks(100.0)
    original = bed.stop_process

    def moved_then_stop(pid: int, still_the_one: Callable[[], bool]) -> bool:
        (bed.proc / str(pid) / "cgroup").write_text("0::/user.slice\n")
        return original(pid, still_the_one)

    bed.loop._stop_process = moved_then_stop
    bed.checks(102.0)
    assert bypass.poll() is None
    assert bed.events == []
    assert bed.metrics.bypass_stopped["uncharged"]._value.get() == 0


def test_a_stop_the_kernel_refuses_is_reported_with_the_reason(make_bed: Callable[..., Bed]) -> None:
    bed = make_bed()
    bed.refused = PermissionError(1, "Operation not permitted")
    bypass = bed.around(600 * MiB)
    bed.checks(100.0, 102.0)
    assert bypass.poll() is None
    ((_, _, reason, message),) = bed.events
    assert reason == DETECTED and message.endswith("could not be stopped (Operation not permitted).")
    assert bed.metrics.bypass_reported["uncharged"]._value.get() == 1


def test_processes_in_no_container_of_the_claim_are_not_judged(make_bed: Callable[..., Bed]) -> None:
    """A host process holding memory on the shared GPU is reported by the scrape, never stopped
    here: the node may run GPU work the exporter knows nothing of."""
    bed = make_bed()
    host = subprocess.Popen(
        [sys.executable, "-c", "import sys; sys.stdin.read()"], stdin=subprocess.PIPE, text=True
    )
    bed.started.append(host)
    (bed.proc / str(host.pid)).mkdir()
    (bed.proc / str(host.pid) / "cgroup").write_text("0::/system.slice/host.service\n")
    bed.listed[host.pid] = 4 * GiB
    bed.checks(100.0, 102.0, 104.0)
    assert host.poll() is None
    assert bed.events == []


def test_a_check_that_keeps_failing_is_logged_once_and_its_recovery_once(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="tessera.exporter.bypass_loop")
    failures = [RuntimeError("the pod index is broken")] * 3

    def containers(namespace: str, name: str) -> list[ContainerRef]:
        if failures:
            raise failures.pop()
        return []

    def messages() -> list[str]:
        return [r.getMessage() for r in caplog.records if r.name == "tessera.exporter.bypass_loop"]

    write_claim(tmp_path / "claims", "u1", "c1", [shim_format.GpuLimit(UUID, GiB, 0)])
    sources = Sources(
        node="node-a",
        claims_dir=tmp_path / "claims",
        gpus=lambda: [gpu(0, uuid=UUID)],
        sample=lambda uuid: GpuSample(None, None, None, None, None, None, {}),
        problems=dict,
        records=dict,
        containers=containers,
        container=lambda p, c: None,
        proc=tmp_path,
    )
    loop = BypassLoop(sources, BypassSettings(STOP, 0, 2.0, 0.01), DaemonMetrics("node-a"), lambda *a: None)
    stop = threading.Event()
    thread = threading.Thread(target=loop.run, args=(stop,))
    thread.start()
    try:
        poll_until(lambda: len(messages()) >= 2 or None, 10, "the loop's recovery logged")
    finally:
        stop.set()
        thread.join(10)
    assert messages() == ["bypass check failed; retrying every 0.01 s", "bypass checks work again"]
