"""How programs reach the shim: linked, dlopen + dlsym, cuGetProcAddress (both signatures, with
versions and flags), and what the shim leaves alone (other libraries' dlsym, unhooked symbols)."""

from __future__ import annotations

import re
import subprocess

import pytest

from tessera.shim.install import built_library_dir
from testbed.shim_harness import SIMGPU_BUILD, ClaimFactory, values

MiB = 1 << 20

CUDA_EXPORTS = {
    *["cuInit", "cuGetProcAddress", "cuGetProcAddress_v2", "cuGetProcAddress_v2_ptsz"],
    *["cuMemAlloc", "cuMemAlloc_v2", "cuMemAllocPitch", "cuMemAllocPitch_v2", "cuMemAllocManaged"],
    *["cuMemAllocAsync", "cuMemAllocAsync_ptsz", "cuMemAllocFromPoolAsync"],
    *["cuMemAllocFromPoolAsync_ptsz", "cuMemFree_v2", "cuMemFreeAsync", "cuMemFreeAsync_ptsz"],
    *["cuMemPoolCreate", "cuMemPoolDestroy", "cuMemPoolTrimTo"],
    *["cuMemCreate", "cuMemRelease", "cuMemMap", "cuMemUnmap", "cuMemImportFromShareableHandle"],
    "cuMemRetainAllocationHandle",
    *["cuArrayCreate", "cuArrayCreate_v2", "cuArray3DCreate", "cuArray3DCreate_v2", "cuArrayDestroy"],
    *["cuMemGetInfo", "cuMemGetInfo_v2", "cuDeviceTotalMem", "cuDeviceTotalMem_v2", "cuCtxDestroy_v2"],
    *["cuDevicePrimaryCtxRetain", "cuDevicePrimaryCtxRelease", "cuDevicePrimaryCtxRelease_v2"],
    *["cuDevicePrimaryCtxReset", "cuDevicePrimaryCtxReset_v2"],
    *["cuLaunchKernel", "cuLaunchKernel_ptsz", "cuLaunchKernelEx", "cuLaunchKernelEx_ptsz"],
    *["cuLaunchCooperativeKernel", "cuLaunchCooperativeKernel_ptsz", "cuGraphLaunch"],
    "cuGraphLaunch_ptsz",
    *["cuStreamBeginCapture", "cuStreamBeginCapture_ptsz", "cuStreamBeginCapture_v2"],
    *["cuStreamBeginCapture_v2_ptsz", "cuStreamBeginCaptureToGraph", "cuStreamBeginCaptureToGraph_ptsz"],
    *["cuStreamBeginCaptureToCig", "cuStreamBeginRecaptureToGraph"],
    *["cuGraphInstantiate", "cuGraphInstantiate_v2", "cuGraphInstantiateWithFlags"],
    *["cuGraphInstantiateWithParams", "cuGraphInstantiateWithParams_ptsz", "cuGraphExecDestroy"],
    "cuDeviceGraphMemTrim",
    "cuMipmappedArrayCreate",
}


def _dynamic(path: str) -> tuple[set[str], str]:
    syms = subprocess.run(["nm", "-D", "--defined-only", path], capture_output=True, text=True, check=True)
    dyn = subprocess.run(["readelf", "-d", path], capture_output=True, text=True, check=True)
    return {line.split()[-1] for line in syms.stdout.splitlines() if line.strip()}, dyn.stdout


def test_exports_only_the_hooks() -> None:
    """The CUDA library exports exactly its hooks (no dlsym, no internals), has soname
    libcuda.so.1, needs the real driver through the alias, and binds its own symbols to itself."""
    exported, dyn = _dynamic(str(built_library_dir() / "libtessera-cuda.so"))
    assert exported == CUDA_EXPORTS
    assert "[libcuda.so.1]" in dyn and "[libcuda-real.so.1]" in dyn
    assert re.search(r"RUNPATH.*\[\$ORIGIN\]", dyn) and "SYMBOLIC" in dyn
    exported, dyn = _dynamic(str(built_library_dir() / "libtessera-nvml.so"))
    assert exported == {"nvmlDeviceGetMemoryInfo", "nvmlDeviceGetMemoryInfo_v2"}
    assert "[libnvidia-ml.so.1]" in dyn and "[libnvidia-ml-real.so.1]" in dyn


def test_dlopen_dlsym_path(make_claim: ClaimFactory) -> None:
    """dlopen("libcuda.so.1") + dlsym reach the hooks: past the limit is out of memory."""
    claim = make_claim()
    assert values(claim.run("shim_probe", "alloc", "mem", str(300 * MiB)).stdout)["rc"] == "2"
    out = values(claim.run("shim_probe", "alloc", "mem", str(200 * MiB)).stdout)
    assert out["rc"] == "0"


def test_linked_path_and_other_libraries_dlsym(make_claim: ClaimFactory, built: object) -> None:
    """A program linked against libcuda reaches the hooks; a library that defines CUDA- and
    curl-named functions still gets its own from dlsym; RTLD_DEFAULT/RTLD_NEXT behave normally."""
    claim = make_claim()
    fake = str(claim.programs / "libfakecu.so")
    done = claim.run("shim_linked", str(300 * MiB), fake)
    assert done.returncode == 0, done.stderr
    out = values(done.stdout)
    assert out["alloc_rc"] == "2"
    assert out["total"] == str(256 * MiB)
    assert out["fake_alloc"] == "12345" and out["curl"] == "7"
    assert out["default_is_linked"] == "1"
    assert out["next_malloc"] == "1" and out["missing"] == "1" and out["next_stable"] == "1"


@pytest.mark.parametrize("getter", ["procaddr", "procaddr_v2", "procaddr_v2_ptsz"])
def test_get_proc_address_paths(make_claim: ClaimFactory, getter: str) -> None:
    """cuMemAlloc fetched through cuGetProcAddress, cuGetProcAddress_v2 and its per-thread
    flavour is the hook: past the limit is out of memory, within it succeeds and is counted."""
    claim = make_claim()
    assert values(claim.run("shim_probe", "alloc", getter, str(300 * MiB)).stdout)["rc"] == "2"
    done = claim.run("shim_probe", "alloc", getter, str(100 * MiB))
    out = done.stdout.splitlines()
    assert values(out[0])["rc"] == "0"
    assert values(out[1])["used"] == str(100 * MiB)
    assert values(done.stdout)["used"] == "0"


@pytest.mark.parametrize("limited", [False, True])
def test_simulator_conformance_unchanged_under_the_shim(
    make_claim: ClaimFactory, limited: bool, simulated_only: None
) -> None:
    """The simulator's own conformance programs pass unchanged under the shim: every unhooked
    symbol resolves to the real driver, and cuGetProcAddress answers every (name, version,
    flags) with exactly what dlsym gives for that ABI (hooked or not); the sharing program's
    IPC, export/import and peer calls (its errors included: failed imports, releases and
    unmaps of what the shim did not record, frees of imported pointers) answer as without it."""
    claim = make_claim(limits=[(0, 900 * MiB, 0), (1, 900 * MiB, 0)] if limited else [], gpus=2)
    for program in ("cuda_api", "nvml_api", "sharing_api"):
        done = subprocess.run(
            [str(SIMGPU_BUILD / "tests" / program)],
            env=claim.env(),
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert done.returncode == 0 and "PASS" in done.stdout, done.stderr


def test_legacy_abi_refused_while_limited(make_claim: ClaimFactory, simulated_only: None) -> None:
    """The 32-bit CUDA 2.x entry points cannot bypass a memory limit: refused while one is in
    force, passed through (here: absent from the driver) otherwise."""
    assert values(make_claim().run("shim_probe", "alloc", "legacy", "4096").stdout)["rc"] == "801"
    unlimited = make_claim(limits=[], name="free")
    assert values(unlimited.run("shim_probe", "alloc", "legacy", "4096").stdout)["rc"] == "500"


UNACCOUNTED = """
import ctypes
cuda = ctypes.CDLL("libcuda.so.1")
ctx = ctypes.c_void_p()
assert cuda.cuInit(0) == 0
assert cuda.cuCtxCreate_v2(ctypes.byref(ctx), 0, 0) == 0
out = ctypes.c_void_p()
desc = (ctypes.c_size_t * 8)()  # CUDA_ARRAY3D_DESCRIPTOR, zeroed
print("mipmap", cuda.cuMipmappedArrayCreate(ctypes.byref(out), desc, 1))
"""


def test_unaccounted_memory_apis_refused_while_limited(
    make_claim: ClaimFactory, simulated_only: None
) -> None:
    """Mipmapped arrays are not accounted, so they are refused (CUDA_ERROR_NOT_SUPPORTED = 801)
    while a memory limit is in force, and pass through to the driver otherwise (the simulator
    has none: CUDA_ERROR_NOT_FOUND = 500). Graph memory nodes are accounted
    (test_shim_graph_memory.py)."""
    done = make_claim().python(UNACCOUNTED)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["mipmap", "801"]
    done = make_claim(limits=[(0, None, 30)], name="compute-only").python(UNACCOUNTED)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["mipmap", "500"]


def test_python_ctypes_program(make_claim: ClaimFactory) -> None:
    """A Python program using ctypes reaches the shim (CDLL finds the preloaded libcuda.so.1):
    limit enforced, memory info virtualised, a destroyed context's memory given back."""
    claim = make_claim()
    code = f"""
import ctypes
cuda = ctypes.CDLL("libcuda.so.1")
ctx, ptr = ctypes.c_void_p(), ctypes.c_uint64()
free, total = ctypes.c_size_t(), ctypes.c_size_t()
assert cuda.cuInit(0) == 0
assert cuda.cuCtxCreate_v2(ctypes.byref(ctx), 0, 0) == 0
print("big", cuda.cuMemAlloc_v2(ctypes.byref(ptr), ctypes.c_size_t({300 * MiB})))
print("ok", cuda.cuMemAlloc_v2(ctypes.byref(ptr), ctypes.c_size_t({100 * MiB})))
cuda.cuMemGetInfo_v2(ctypes.byref(free), ctypes.byref(total))
print("info", total.value, total.value - free.value)
assert cuda.cuCtxDestroy_v2(ctx) == 0
assert cuda.cuCtxCreate_v2(ctypes.byref(ctx), 0, 0) == 0
cuda.cuMemGetInfo_v2(ctypes.byref(free), ctypes.byref(total))
print("after", total.value - free.value)
"""
    done = claim.python(code)
    assert done.returncode == 0, done.stderr
    lines = dict(line.split(" ", 1) for line in done.stdout.splitlines())
    assert lines["big"] == "2" and lines["ok"] == "0"
    assert lines["info"] == f"{256 * MiB} {100 * MiB}"
    assert lines["after"] == "0"


def test_application_signal_handlers_are_left_alone(make_claim: ClaimFactory) -> None:
    """The shim installs no signal handler and changes no signal mask: an application's handlers
    for SIGUSR1, SIGUSR2, SIGTERM and SIGCHLD (installed before CUDA is initialised through the
    shim, with memory and cores limits in force), and the default SIGSEGV/SIGBUS dispositions, are
    the same - handler, flags and mask, for every signal - after allocations, a refusal and capped
    launches, and the handlers are still the ones the signals are delivered to."""
    claim = make_claim(limits=[(0, 256 << 20, 50)])
    done = claim.run("shim_probe", "signals")
    assert done.returncode == 0, done.stderr
    assert values(done.stdout)["refused_rc"] == "2"  # the memory limit was in force
    assert values(done.stdout)["changed"] == "0", done.stdout
    assert values(done.stdout)["mask_changed"] == "0"
    assert values(done.stdout)["segv_default"] == "1" and values(done.stdout)["bus_default"] == "1"
    delivered = values(done.stdout.splitlines()[-1])
    assert delivered == {"usr1": "1", "usr2": "1", "term": "1", "chld": "1"}, done.stdout
