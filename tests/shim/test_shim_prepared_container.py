"""In a prepared container the shim takes its limits from the fixed paths prepare mounts, and
nothing the container controls - its environment, files it writes - lifts them.

Each test runs a program the way a prepared container runs it: in a mount namespace of its own
with the claim's folder (shim, limits file, usage region) bind-mounted read-only at /run/tessera
and the region read-write over its own file there (Claim.run_prepared). The attacks are the ones a
tenant tried against the environment-driven shim, which allocated past its claim each time, and
the ones it tried next with the files: renaming the folder that holds them, putting a folder of its
own in their place, preloading a copy of the shim, mounting over them."""

from __future__ import annotations

import os
import re
import shutil
import sys
from pathlib import Path

import pytest

from tessera.shim.format import EXIT_BAD_LIMITS, GpuLimit, read_limits, write_limits
from testbed.shim_harness import Claim, ClaimFactory, values

MiB = 1 << 20
LIMIT = 256 * MiB
OUT_OF_MEMORY = "2"

pytestmark = pytest.mark.skipif(
    os.geteuid() != 0 or shutil.which("unshare") is None,
    reason="a prepared container is imitated with a private mount namespace, which needs root",
)


def _allocate(claim: Claim, size: int, env: dict[str, str] | None = None, device: int = 0) -> str:
    """The CUDA result code of one allocation of ``size`` bytes in a prepared container."""
    done = claim.run_prepared(
        "shim_probe", "alloc", "mem", str(size), env={"PROBE_DEVICE": str(device), **(env or {})}
    )
    assert done.returncode == 0, f"exit {done.returncode}: {done.stderr}"
    return values(done.stdout.splitlines()[0])["rc"]


def _own_limits_file(directory: Path, uuid: str) -> Path:
    """What a tenant writes in a folder it can write: its GPU, 8 GiB, all cores, mode 0444."""
    return write_limits(directory / "mine", [GpuLimit(uuid, 8 << 30, 100)])


def test_the_fixed_limits_hold(make_claim: ClaimFactory) -> None:
    """With nothing in the environment, the claim's limits apply: within them succeeds, past
    them is refused."""
    claim = make_claim(limits=[(0, LIMIT, 0)])
    assert _allocate(claim, LIMIT // 2) == "0"
    assert _allocate(claim, LIMIT + MiB) == OUT_OF_MEMORY


@pytest.mark.parametrize(
    "redirect",
    ["unset", "empty", "missing file", "own file", "huge"],
)
def test_the_environment_cannot_redirect_the_limits(
    make_claim: ClaimFactory, tmp_path: Path, redirect: str
) -> None:
    """$TESSERA_LIMITS_FILE unset, empty, naming a missing file, a limits file the tenant wrote or
    a path of 100 000 characters: the claim's limits still apply, and a redirect is named as
    ignored in one bounded log line."""
    claim = make_claim(limits=[(0, LIMIT, 0)])
    assert claim.limits is not None
    (own_gpu,) = read_limits(claim.limits) or []
    env = {
        "unset": {},
        "empty": {"TESSERA_LIMITS_FILE": ""},
        "missing file": {"TESSERA_LIMITS_FILE": str(tmp_path / "nonexistent")},
        "own file": {"TESSERA_LIMITS_FILE": str(_own_limits_file(tmp_path, own_gpu.uuid))},
        "huge": {"TESSERA_LIMITS_FILE": "/" + "x" * 100_000},
    }[redirect]
    done = claim.run_prepared("shim_probe", "alloc", "mem", str(LIMIT + MiB), env=env)
    assert done.returncode == 0, done.stderr
    assert values(done.stdout.splitlines()[0])["rc"] == OUT_OF_MEMORY
    if env.get("TESSERA_LIMITS_FILE"):
        assert "ignoring TESSERA_LIMITS_FILE=" in done.stderr
        assert max(len(line) for line in done.stderr.splitlines()) < 1024


@pytest.mark.parametrize("value", ["true", "1", "TRUE"])
def test_the_environment_cannot_turn_enforcement_off(
    make_claim: ClaimFactory, tmp_path: Path, value: str
) -> None:
    """HAMi's opt-out CUDA_DISABLE_CONTROL (and its priority variable, and a priority-board folder
    of the tenant's own) set inside the container change nothing: the limits still hold. Only
    the claim's ShareConfig, checked by the driver on a whole GPU, turns enforcement off, and then
    the shim is not in the container at all (docs/driver.md, "Share configuration")."""
    claim = make_claim(limits=[(0, LIMIT, 0)])
    env = {"CUDA_DISABLE_CONTROL": value, "CUDA_TASK_PRIORITY": "0", "TESSERA_PRIORITY_DIR": str(tmp_path)}
    assert _allocate(claim, LIMIT // 2, env=env) == "0"
    assert _allocate(claim, LIMIT + MiB, env=env) == OUT_OF_MEMORY


def test_the_environment_cannot_make_the_region_private(make_claim: ClaimFactory, tmp_path: Path) -> None:
    """$TESSERA_USAGE_REGION unset or pointed elsewhere does not give a process a region of its
    own (which would give every process the claim's whole limit): usage held by one process counts
    against the next."""
    claim = make_claim(limits=[(0, LIMIT, 0)])
    holder = claim.run_prepared(
        "shim_probe",
        "alloc",
        "mem",
        str(LIMIT // 2),
        env={"TESSERA_USAGE_REGION": str(tmp_path / "elsewhere")},
    )
    assert holder.returncode == 0, holder.stderr
    # The holder freed its memory before exiting: the region it used is the claim's own.
    assert not (tmp_path / "elsewhere").exists()
    assert _allocate(claim, LIMIT // 2 + MiB, env={"TESSERA_USAGE_REGION": ""}) == "0"


def test_a_gpu_outside_the_claim_gets_nothing(make_claim: ClaimFactory) -> None:
    """A GPU the limits file does not name that the process sees anyway (here CUDA_VISIBLE_DEVICES
    does not hide it, as a tenant who unsets the variable on the simulated driver gets) is none of
    the container's: every allocation on it is refused, and the shim says why."""
    claim = make_claim(limits=[(0, LIMIT, 0)], gpus=2)
    assert "CUDA_VISIBLE_DEVICES" not in claim.base_env
    done = claim.run_prepared("shim_probe", "alloc", "mem", str(MiB), env={"PROBE_DEVICE": "1"})
    assert done.returncode == 0, done.stderr
    assert values(done.stdout.splitlines()[0])["rc"] == OUT_OF_MEMORY
    assert "is not part of this container's claim" in done.stderr


def test_a_prepared_shim_without_its_limits_file_stops(make_claim: ClaimFactory) -> None:
    """The shim loaded from the prepared shim folder with no limits file in the claim's folder
    stops the process rather than run unlimited, naming the path."""
    claim = make_claim(limits=[(0, LIMIT, 0)])
    assert claim.limits is not None
    claim.limits.unlink()
    done = claim.run_prepared("shim_probe", "alloc", "mem", str(MiB))
    assert done.returncode == EXIT_BAD_LIMITS, done.stdout
    assert "limits file /run/tessera/limits is missing" in done.stderr


def test_a_bad_limits_file_is_named_by_its_path_in_the_container(make_claim: ClaimFactory) -> None:
    """The shim reads the claim's files through its checked mount, but the line that says why it
    stops names them as the container sees them."""
    claim = make_claim(limits=[(0, LIMIT, 0)])
    assert claim.limits is not None
    claim.limits.chmod(0o644)
    claim.limits.write_text("not limits\n")
    claim.limits.chmod(0o444)
    done = claim.run_prepared("shim_probe", "alloc", "mem", str(MiB))
    assert done.returncode == EXIT_BAD_LIMITS, done.stdout
    assert "/run/tessera/limits: malformed" in done.stderr
    assert "/proc/self/fd" not in done.stderr


def test_the_claims_folder_cannot_be_renamed(make_claim: ClaimFactory) -> None:
    """`mv /run/tessera /run/tessera.old` - which let a tenant put a folder of its own there - fails
    (the folder is a mount point), and the claim's limit holds afterwards."""
    claim = make_claim(limits=[(0, LIMIT, 0)])
    done = claim.run_prepared(
        "shim_probe", "alloc", "mem", str(LIMIT + MiB), tenant="mv /run/tessera /run/tessera.old; echo mv=$?"
    )
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0] != "mv=0", f"the claim's folder was renamed: {done.stderr}"
    assert values(lines[1])["rc"] == OUT_OF_MEMORY


def _own_folder(scratch: Path, tenant_limits: Path) -> str:
    """Shell lines that make /run/tessera a folder of the tenant's own, as it is once the real one
    has been moved aside with its parent: a copy of the shim, its own limits file (8 GiB, all
    cores) and an empty usage region."""
    return "\n".join(
        [
            f"cp -r /run/tessera/shim {scratch}/ && cp /run/tessera/usage {scratch}/",
            "umount /run/tessera/usage; umount /run/tessera",
            f"cp -r {scratch}/shim /run/tessera/ && cp {scratch}/usage /run/tessera/usage",
            f"cp {tenant_limits} /run/tessera/limits && chmod 0444 /run/tessera/limits",
        ]
    )


def test_a_folder_of_the_tenants_own_at_the_fixed_path_stops_the_process(
    make_claim: ClaimFactory, tmp_path: Path
) -> None:
    """With /run/tessera an ordinary folder of the container holding a copy of the shim, the
    tenant's own limits file (8 GiB, all cores, mode 0444) and a usage region - what renaming the
    folder's parent and refilling it gives - the shim stops the process (exit 78, saying the folder
    is not the claim's mount) instead of taking those limits."""
    claim = make_claim(limits=[(0, LIMIT, 0)])
    assert claim.limits is not None
    (own_gpu,) = read_limits(claim.limits) or []
    own = _own_limits_file(tmp_path, own_gpu.uuid)
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    done = claim.run_prepared(
        "shim_probe", "alloc", "mem", str(LIMIT + MiB), tenant=_own_folder(scratch, own)
    )
    assert done.returncode == EXIT_BAD_LIMITS, f"{done.stdout}\n{done.stderr}"
    assert "/run/tessera is not the read-only mount of the claim's folder" in done.stderr


def test_a_copy_of_the_shim_preloaded_from_elsewhere_stops_the_process(
    make_claim: ClaimFactory, tmp_path: Path
) -> None:
    """A copy of the shim preloaded from a folder the tenant writes, beside the real claim's
    mount, stops the process: only the shim in the claim's own folder may read its files."""
    claim = make_claim(limits=[(0, LIMIT, 0)])
    copy = tmp_path / "copied-shim"
    done = claim.run_prepared(
        "shim_probe",
        "alloc",
        "mem",
        str(MiB),
        tenant=f"cp -r /run/tessera/shim {copy}",
        env={"LD_PRELOAD": f"{copy}/libtessera-cuda.so:{copy}/libtessera-nvml.so"},
    )
    assert done.returncode == EXIT_BAD_LIMITS, f"{done.stdout}\n{done.stderr}"
    assert "the shim was not loaded from /run/tessera/shim" in done.stderr


@pytest.mark.parametrize("target", ["limits", "usage"])
def test_a_file_mounted_over_the_claims_own_stops_the_process(
    make_claim: ClaimFactory, tmp_path: Path, target: str
) -> None:
    """A mount over the limits file or the usage region - what a pod volume at that path, or a
    tenant allowed to make mounts, would put there - stops the process instead of being read."""
    claim = make_claim(limits=[(0, LIMIT, 0)])
    assert claim.limits is not None and claim.region is not None
    (own_gpu,) = read_limits(claim.limits) or []
    own = {"limits": _own_limits_file(tmp_path, own_gpu.uuid), "usage": tmp_path / "usage"}[target]
    if target == "usage":
        shutil.copyfile(claim.region, own)
    done = claim.run_prepared(
        "shim_probe", "alloc", "mem", str(LIMIT + MiB), tenant=f"mount --bind {own} /run/tessera/{target}"
    )
    assert done.returncode == EXIT_BAD_LIMITS, f"{done.stdout}\n{done.stderr}"
    assert f"/run/tessera/{target} is not the claim folder's" in done.stderr


def test_memory_info_shows_the_fixed_limit(make_claim: ClaimFactory) -> None:
    """Both halves read the same fixed limits: CUDA's and NVML's memory info show the claim's
    share whatever the environment says."""
    claim = make_claim(limits=[(0, LIMIT, 0)])
    env = {"TESSERA_LIMITS_FILE": ""}
    cuda = claim.run_prepared("shim_probe", "info", env=env)
    assert cuda.returncode == 0, cuda.stderr
    assert values(cuda.stdout)["total"] == str(LIMIT)
    nvml = claim.run_prepared(
        sys.executable,
        "-c",
        "import pynvml as n; n.nvmlInit(); "
        "print('total=%d' % n.nvmlDeviceGetMemoryInfo(n.nvmlDeviceGetHandleByIndex(0)).total)",
        env=env,
    )
    assert nvml.returncode == 0, nvml.stderr
    assert values(nvml.stdout)["total"] == str(LIMIT)


def test_the_shim_and_the_driver_agree_on_the_fixed_paths() -> None:
    """The paths the shim trusts are the ones prepare's CDI spec mounts at."""
    from tessera.driver.claim_files import (
        CONTAINER_BOARDS,
        CONTAINER_DIR,
        CONTAINER_LIMITS,
        CONTAINER_REGION,
        CONTAINER_SHIM_DIR,
    )
    from testbed.shim_harness import REPO

    header = (REPO / "tessera" / "shim" / "include" / "tessera_shim.h").read_text()
    macros = _string_macros(header)
    for macro, path in (
        ("TESSERA_CONTAINER_DIR", CONTAINER_DIR),
        ("TESSERA_CONTAINER_LIMITS", CONTAINER_LIMITS),
        ("TESSERA_CONTAINER_REGION", CONTAINER_REGION),
        ("TESSERA_CONTAINER_SHIM_DIR", CONTAINER_SHIM_DIR),
        ("TESSERA_CONTAINER_PRIORITY_DIR", CONTAINER_BOARDS),
    ):
        assert macros.get(macro) == str(path), (macro, macros.get(macro))


def _string_macros(header: str) -> dict[str, str]:
    """The header's #defines whose value is string literals and earlier such macros, concatenated
    as the compiler would."""
    found: dict[str, str] = {}
    for line in header.splitlines():
        match = re.fullmatch(r"#define (\w+) ((?:\s*(?:\"[^\"]*\"|\w+))+)\s*", line)
        if match is None:
            continue
        parts = re.findall(r'"([^"]*)"|(\w+)', match.group(2))
        if all(literal or name in found for literal, name in parts):
            found[match.group(1)] = "".join(literal or found[name] for literal, name in parts)
    return found


def test_without_the_kernels_word_on_its_mounts_the_shim_stops(make_claim: ClaimFactory) -> None:
    """With /proc covered (no fdinfo, no mountinfo) the shim cannot tell whether /run/tessera is
    the claim's mount, and stops the process rather than trust the path."""
    claim = make_claim(limits=[(0, LIMIT, 0)])
    done = claim.run_prepared("shim_probe", "alloc", "mem", str(MiB), tenant="mount -t tmpfs tmpfs /proc")
    assert done.returncode == EXIT_BAD_LIMITS, f"{done.stdout}\n{done.stderr}"
    assert "cannot tell which mount /run/tessera is: cannot read /proc/self/fdinfo/" in done.stderr
