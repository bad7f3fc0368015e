"""The limits file and usage region formats (through the shim's own C code), and how the shim
reacts to a missing, unreadable or malformed limits file, a bad region, and its log level."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from simgpu.node import read_line, release
from tessera.shim.format import (
    EXIT_BAD_LIMITS,
    PRIORITY_HIGH,
    PRIORITY_LOW,
    GpuLimit,
    LimitsError,
    format_limits,
    parse_limits,
    read_limits,
    read_region,
    write_limits,
)
from testbed.shim_harness import ClaimFactory, values

UUID = "GPU-5fd3a0a4-2f3c-4d1e-9a11-0c5b1e4f8d21"
MiB = 1 << 20


def test_limits_round_trip(tmp_path: Path) -> None:
    """What the writer produces, the shim's parser reads back unchanged; the file is read-only."""
    limits = [GpuLimit(UUID, 8 << 30, 30), GpuLimit("MIG-0b8e7e9c-1111-2222-3333-444455556666", None, 0)]
    assert parse_limits(format_limits(limits)) == limits
    path = write_limits(tmp_path / "limits", limits)
    assert read_limits(path) == limits
    assert (path.stat().st_mode & 0o777) == 0o444
    assert read_limits(tmp_path / "absent") is None


@pytest.mark.parametrize(
    ("text", "reason"),
    [
        ("", "expected 'tessera-limits 1'"),
        ("tessera-limits 2\n", "version 2 is not supported"),
        (f"{UUID} memory=1 cores=0\n", "line 1: expected 'tessera-limits 1' first"),
        (f"tessera-limits 1\n{UUID} memory=1\n", "line 2: expected '<uuid>"),
        (f"tessera-limits 1\n{UUID} cores=1 memory=1\n", "line 2: expected memory="),
        (f"tessera-limits 1\n{UUID} memory=-1 cores=0\n", "memory must be"),
        (f"tessera-limits 1\n{UUID} memory=01 cores=0\n", "memory must be"),
        (f"tessera-limits 1\n{UUID} memory=99999999999999999999 cores=0\n", "memory must be"),
        (f"tessera-limits 1\n{UUID} memory=1 cores=101\n", "cores must be 0-100"),
        (f"tessera-limits 1\n{UUID} memory=1 cores=0 extra=1\n", "line 2: expected"),
        ("tessera-limits 1\n0 memory=1 cores=0\n", "not a GPU UUID"),
        (f"tessera-limits 1\n{UUID} memory=1 cores=0\n{UUID} memory=2 cores=0\n", "listed twice"),
        (
            "tessera-limits 1\n" + "".join(f"GPU-{i:04x} memory=1 cores=0\n" for i in range(17)),
            "more than 16",
        ),
        ("tessera-limits 1\n\u00e9\n", "not ASCII"),
    ],
)
def test_malformed_limits_are_refused_with_a_reason(text: str, reason: str) -> None:
    """Every malformation is refused with a reason naming the line."""
    with pytest.raises(LimitsError, match=reason):
        parse_limits(text)


def test_comments_blank_lines_and_crlf_are_fine() -> None:
    """Comments, blank lines and CRLF line ends are accepted."""
    text = f"# c\r\n\r\ntessera-limits 1\r\n  # indented comment\n{UUID}  memory=none\tcores=100\r\n"
    assert parse_limits(text) == [GpuLimit(UUID, None, 100)]


def test_writer_refuses_invalid_limits() -> None:
    """The writer refuses what the parser would refuse."""
    for bad in ([GpuLimit("nope", 1, 0)], [GpuLimit(UUID, 1, 101)], [GpuLimit(UUID, 1), GpuLimit(UUID, 2)]):
        with pytest.raises(LimitsError):
            format_limits(bad)


def test_a_named_limits_file_that_is_missing_stops_the_process(make_claim: ClaimFactory) -> None:
    """$TESSERA_LIMITS_FILE naming a file that does not exist is an error, not "no limits": the
    process stops at its first CUDA or NVML call with the path in the message and exit status 78."""
    claim = make_claim()
    assert claim.limits is not None
    claim.limits.unlink()
    done = claim.run("shim_probe", "alloc", "mem", str(512 * MiB))
    assert done.returncode == EXIT_BAD_LIMITS, done.stdout
    assert f"the limits file {claim.limits}" in done.stderr and "does not exist" in done.stderr
    nvml = claim.python(
        "import pynvml as n; n.nvmlInit(); n.nvmlDeviceGetMemoryInfo(n.nvmlDeviceGetHandleByIndex(0))"
    )
    assert nvml.returncode == EXIT_BAD_LIMITS


def test_no_limits_file_named_outside_a_container_means_no_limits(
    make_claim: ClaimFactory, simulated_only: None
) -> None:
    """Outside a prepared container, a process whose environment names no limits file is not a
    Tessera container: it runs unlimited and sees the whole GPU (the documented choice)."""
    claim = make_claim()
    claim.limits = None
    done = claim.run("shim_probe", "alloc", "mem", str(512 * MiB))
    assert done.returncode == 0, done.stderr
    assert values(done.stdout.splitlines()[1])["total"] == str(1 << 30)


@pytest.mark.parametrize("problem", ["malformed", "group-writable", "directory"])
def test_bad_limits_file_stops_the_process(make_claim: ClaimFactory, problem: str) -> None:
    """An unreadable or malformed limits file stops the process at its first CUDA call, with a
    message naming the file and the reason and exit status 78."""
    claim = make_claim()
    assert claim.limits is not None
    os.chmod(claim.limits, 0o644)
    if problem == "malformed":
        claim.limits.write_text("tessera-limits 1\nGPU-1234 memory=lots cores=0\n")
    elif problem == "group-writable":
        os.chmod(claim.limits, 0o664)
    else:
        claim.limits.unlink()
        claim.limits.mkdir()
    done = claim.run("shim_probe", "info")
    assert done.returncode == EXIT_BAD_LIMITS
    assert str(claim.limits) in done.stderr and "fatal" in done.stderr
    nvml = claim.python(
        "import pynvml as n; n.nvmlInit(); n.nvmlDeviceGetMemoryInfo(n.nvmlDeviceGetHandleByIndex(0))"
    )
    assert nvml.returncode == EXIT_BAD_LIMITS


def test_bad_usage_region_stops_the_process(make_claim: ClaimFactory) -> None:
    """A usage region that is not one (wrong size or magic) stops the process with a message."""
    claim = make_claim()
    assert claim.region is not None
    claim.region.write_bytes(b"not a region")
    done = claim.run("shim_probe", "info")
    assert done.returncode == EXIT_BAD_LIMITS
    assert "usage region" in done.stderr


def test_region_is_created_when_missing(make_claim: ClaimFactory) -> None:
    """A process that finds the named usage region missing creates it; its usage shows there
    while it holds the memory (the claim's total and its own slot, by pid), and is gone once it
    has freed it and exited."""
    claim = make_claim(region=False)
    claim.region = claim.install_dir.parent / "created-usage"
    assert not claim.region.exists()
    holder = claim.start("shim_probe", "alloc", "mem", str(8 * MiB), "hold")
    try:
        read_line(holder, "HOLD")
        while_held = read_region(claim.region)
        assert [g.used_bytes for g in while_held.gpus] == [8 * MiB]
        assert [(p.pid, list(p.used_bytes.values())) for p in while_held.processes] == [
            (holder.pid, [8 * MiB])
        ]
    finally:
        release(holder)
    assert holder.returncode == 0
    snapshot = read_region(claim.region)
    assert [g.used_bytes for g in snapshot.gpus] == [0]
    assert snapshot.processes == []


def test_a_process_slot_names_its_process_by_pid_and_start_time(make_claim: ClaimFactory) -> None:
    """The slot records the process's start time as /proc/<pid>/stat field 22 (clock ticks after
    boot): with the pid it names the process even after the pid is reused, and the exporter and
    docs/shim.md rely on it being that field."""
    claim = make_claim()
    assert claim.region is not None
    holder = claim.start("shim_probe", "alloc", "mem", str(MiB), "hold")
    try:
        read_line(holder, "HOLD")
        stat = Path(f"/proc/{holder.pid}/stat").read_text()
        start_time = int(stat[stat.rindex(")") + 2 :].split()[22 - 3])
        (process,) = read_region(claim.region).processes
        assert (process.pid, process.start_time) == (holder.pid, start_time)
    finally:
        release(holder)


def test_without_a_region_limits_apply_per_process(make_claim: ClaimFactory) -> None:
    """Without $TESSERA_USAGE_REGION the limits still hold, per process, with a warning."""
    claim = make_claim(region=False)
    done = claim.run("shim_probe", "alloc", "mem", str(300 * MiB))
    assert values(done.stdout)["rc"] == "2"
    assert "limits apply to each process on its own" in done.stderr


def test_log_level_and_summary(make_claim: ClaimFactory) -> None:
    """At level info the shim prints one summary line of the limits in force; at the default
    level it is silent; an unknown level is reported and the default used."""
    claim = make_claim(limits=[(0, 256 * MiB, 30)], log_level="info")
    done = claim.run("shim_probe", "info")
    summary = [line for line in done.stderr.splitlines() if "limits from" in line]
    assert len(summary) == 1
    assert "memory 256.00 MiB compute 30%" in summary[0] and "usage region" in summary[0]
    quiet = make_claim(name="quiet")
    assert quiet.run("shim_probe", "info").stderr == ""
    noisy = make_claim(name="noisy", log_level="verbose")
    assert "is not error|warn|info|debug" in noisy.run("shim_probe", "info").stderr


def test_a_gpu_the_process_cannot_see_is_reported_once(make_claim: ClaimFactory) -> None:
    """A UUID in the limits file that matches no CUDA device of the process limits nothing there:
    at the default log level the shim says so once, naming the UUID; the GPU it does see stays
    limited, and a file whose GPUs are all visible draws no such line."""
    claim = make_claim(limits=[(0, 256 * MiB, 0)])
    assert claim.limits is not None
    own = read_limits(claim.limits)
    assert own is not None
    os.chmod(claim.limits, 0o644)
    write_limits(claim.limits, [*own, GpuLimit(UUID, 64 * MiB, 0)])
    done = claim.run("shim_probe", "alloc", "mem", str(300 * MiB))
    assert values(done.stdout)["rc"] == "2"  # device 0 is still limited to 256 MiB
    lines = [line for line in done.stderr.splitlines() if UUID in line]
    assert len(lines) == 1, done.stderr
    assert "warn:" in lines[0] and "its limits apply to nothing here" in lines[0]
    quiet = make_claim(name="quiet")
    assert "limits file names GPU" not in quiet.run("shim_probe", "alloc", "mem", str(MiB)).stderr


def test_a_gpu_hidden_by_cuda_visible_devices_is_reported(make_claim: ClaimFactory) -> None:
    """A claim of two GPUs in a process that CUDA_VISIBLE_DEVICES shows one of: the hidden one is
    named once, with the variable's value."""
    claim = make_claim(limits=[(0, 256 * MiB, 0), (1, 256 * MiB, 0)], gpus=2)
    assert claim.limits is not None
    limits = read_limits(claim.limits)
    assert limits is not None
    hidden = limits[1].uuid
    done = claim.run("shim_probe", "alloc", "mem", str(MiB), env={"CUDA_VISIBLE_DEVICES": "0"})
    assert done.returncode == 0, done.stderr
    lines = [line for line in done.stderr.splitlines() if "limits file names GPU" in line]
    assert len(lines) == 1 and hidden in lines[0] and "CUDA_VISIBLE_DEVICES=0" in lines[0]


@pytest.mark.parametrize(
    ("text", "reason"),
    [
        (f"tessera-limits 1\n{UUID} memory=1 cores=0 priority=2\n", "priority must be 0 .high. or 1 .low."),
        (f"tessera-limits 1\n{UUID} memory=1 cores=0 priority=-1\n", "priority must be"),
        (f"tessera-limits 1\n{UUID} memory=1 cores=0 priority=01\n", "priority must be"),
        (f"tessera-limits 1\n{UUID} memory=1 cores=0 priority=\n", "line 2: expected priority="),
        (f"tessera-limits 1\n{UUID} memory=1 cores=0 priority=99999999999999999999\n", "priority must be"),
        (f"tessera-limits 1\n{UUID} memory=1 priority=0 cores=0\n", "line 2: expected cores="),
        (f"tessera-limits 1\n{UUID} memory=1 cores=0 priority=0 priority=0\n", "line 2: expected '<uuid>"),
        (f"tessera-limits 1\n{UUID} memory=1 cores=0 prio=0\n", "line 2: expected priority="),
    ],
)
def test_malformed_priority_is_refused_with_a_reason(text: str, reason: str) -> None:
    """Priority is 0 or 1, after cores, once; anything else is refused naming the line."""
    with pytest.raises(LimitsError, match=reason):
        parse_limits(text)


def test_priority_round_trips_and_old_files_read_as_low_priority() -> None:
    """The writer always writes priority and it reads back; a line without it (a file from before
    priority existed) is low priority, HAMi's default."""
    limits = [GpuLimit(UUID, 1, 0, PRIORITY_HIGH), GpuLimit("GPU-0b8e", None, 50, PRIORITY_LOW)]
    text = format_limits(limits)
    assert f"{UUID} memory=1 cores=0 priority=0\n" in text
    assert parse_limits(text) == limits
    assert parse_limits(f"tessera-limits 1\n{UUID} memory=1 cores=0\n") == [
        GpuLimit(UUID, 1, 0, PRIORITY_LOW)
    ]
    with pytest.raises(LimitsError, match=r"priority must be 0 \(high\) or 1 \(low\)"):
        format_limits([GpuLimit(UUID, 1, 0, 2)])
