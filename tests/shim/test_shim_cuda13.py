"""CUDA 13 clients under the shim: every entry point a client built for CUDA 13 can fetch for a
hooked function is the hook, whatever version it asks for, and the allocation paths CUDA 13
clients use (retained VMM handles, the newest graph-node and capture entry points) cannot step
around the claim's limit."""

from __future__ import annotations

import json

from testbed.shim_harness import ClaimFactory

MiB = 1 << 20
CUDA13 = {"driver_version": "580.65.06", "cuda_driver_version": 13050}

# The hooked base names, each with the versions that introduced an ABI of it (the shim's table,
# src/procaddr.c) and the driver's newest; a client may ask for any of them.
HOOKED_ON_THE_SIMULATOR = """
import ctypes, json
cuda = ctypes.CDLL("libcuda.so.1")
libc = ctypes.CDLL(None)
class DlInfo(ctypes.Structure):
    _fields_ = [("fname", ctypes.c_char_p), ("fbase", ctypes.c_void_p),
                ("sname", ctypes.c_char_p), ("saddr", ctypes.c_void_p)]
def origin(fn):
    info = DlInfo()
    assert libc.dladdr(ctypes.c_void_p(fn), ctypes.byref(info)) != 0
    return info.fname.decode().rsplit("/", 1)[-1], info.sname.decode()
driver = ctypes.c_int()
assert cuda.cuDriverGetVersion(ctypes.byref(driver)) == 0
names = {
    "cuInit": [2000], "cuGetProcAddress": [11030, 12000], "cuMemAlloc": [3020],
    "cuMemAllocPitch": [3020], "cuMemAllocManaged": [6000], "cuMemFree": [3020],
    "cuMemGetInfo": [3020], "cuDeviceTotalMem": [3020], "cuMemAllocAsync": [11020],
    "cuMemFreeAsync": [11020], "cuMemAllocFromPoolAsync": [11020], "cuMemPoolCreate": [11020],
    "cuMemPoolDestroy": [11020], "cuMemPoolTrimTo": [11020], "cuMemCreate": [10020],
    "cuMemRelease": [10020], "cuMemRetainAllocationHandle": [11000],
    "cuMemImportFromShareableHandle": [10020], "cuMemMap": [10020], "cuMemUnmap": [10020],
    "cuArrayCreate": [3020], "cuArray3DCreate": [3020], "cuArrayDestroy": [2000],
    "cuCtxDestroy": [4000], "cuDevicePrimaryCtxRetain": [7000],
    "cuDevicePrimaryCtxRelease": [11000], "cuDevicePrimaryCtxReset": [11000],
    "cuLaunchKernel": [4000], "cuLaunchKernelEx": [11060], "cuLaunchCooperativeKernel": [9000],
    "cuGraphLaunch": [10000], "cuStreamBeginCapture": [10010],
}
seen = {}
for name, versions in names.items():
    for version in versions + [driver.value]:
        for flags in (0, 2):  # DEFAULT, PER_THREAD_DEFAULT_STREAM
            fn = ctypes.c_void_p()
            status = ctypes.c_int(-1)
            rc = cuda.cuGetProcAddress_v2(name.encode(), ctypes.byref(fn), version,
                                          ctypes.c_uint64(flags), ctypes.byref(status))
            seen[f"{name}@{version}/{flags}"] = [rc, *origin(fn.value)] if rc == 0 else [rc]
print(json.dumps({"driver": driver.value, "seen": seen}))
"""


def test_every_version_a_cuda13_client_can_fetch_of_a_hooked_function_is_the_hook(
    make_claim: ClaimFactory, simulated_only: None
) -> None:
    """On a CUDA 13.5 node, each hooked function fetched through cuGetProcAddress_v2 at the
    version that introduced each of its ABIs and at the driver's own version, with the default and
    the per-thread flags, is a function of the shim's library (libtessera-cuda.so), never the
    driver's: a client cannot step around a limit by asking for a newer version."""
    done = make_claim(**CUDA13).python(HOOKED_ON_THE_SIMULATOR)
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout)
    assert out["driver"] == 13050
    not_hooked = {key: got for key, got in out["seen"].items() if got[:2] != [0, "libtessera-cuda.so"]}
    assert not_hooked == {}
    assert len(out["seen"]) == 2 * (33 + 32)  # 33 (name, ABI version) pairs + 32 at 13050, two flags each
    assert out["seen"]["cuMemAlloc@13050/0"] == [0, "libtessera-cuda.so", "cuMemAlloc_v2"]
    assert out["seen"]["cuMemRetainAllocationHandle@13050/0"] == [
        0,
        "libtessera-cuda.so",
        "cuMemRetainAllocationHandle",
    ]
    assert out["seen"]["cuLaunchKernel@13050/2"] == [0, "libtessera-cuda.so", "cuLaunchKernel_ptsz"]
    assert out["seen"]["cuMemAllocAsync@13050/2"] == [0, "libtessera-cuda.so", "cuMemAllocAsync_ptsz"]


RETAIN = f"""
import ctypes, json
cuda = ctypes.CDLL("libcuda.so.1")
class Prop(ctypes.Structure):
    _fields_ = [("type", ctypes.c_int), ("handleTypes", ctypes.c_int), ("locType", ctypes.c_int),
                ("locId", ctypes.c_int), ("win32", ctypes.c_void_p), ("flags", ctypes.c_ubyte * 8)]
class Access(ctypes.Structure):
    _fields_ = [("locType", ctypes.c_int), ("locId", ctypes.c_int), ("flags", ctypes.c_int)]
ctx = ctypes.c_void_p()
assert cuda.cuInit(0) == 0
assert cuda.cuCtxCreate_v2(ctypes.byref(ctx), 0, 0) == 0
def used():
    free, total = ctypes.c_size_t(), ctypes.c_size_t()
    assert cuda.cuMemGetInfo_v2(ctypes.byref(free), ctypes.byref(total)) == 0
    return total.value - free.value
prop = Prop(type=1, locType=1, locId=0)
size = ctypes.c_size_t({64 * MiB})
none = ctypes.c_uint64(0)
def create():
    handle = ctypes.c_uint64()
    return cuda.cuMemCreate(ctypes.byref(handle), size, ctypes.byref(prop), none), handle
def mapped(handle):
    va = ctypes.c_uint64()
    assert cuda.cuMemAddressReserve(ctypes.byref(va), size, ctypes.c_size_t(0), none, none) == 0
    assert cuda.cuMemMap(va, size, ctypes.c_size_t(0), handle, none) == 0
    return va
def retain(address):
    handle = ctypes.c_uint64()
    assert cuda.cuMemRetainAllocationHandle(ctypes.byref(handle), ctypes.c_void_p(address)) == 0
    return handle
retained, steps = [], []
# Each round: create, map, retain from an address inside the mapping, release the handle, unmap.
# The retained reference keeps the memory on the GPU, so it keeps the charge too.
for _ in range(5):
    rc, handle = create()
    if rc != 0:
        steps.append(["create", rc, used()])
        break
    va = mapped(handle)
    again = retain(va.value + 12345)
    assert again.value == handle.value
    assert cuda.cuMemRelease(handle) == 0
    assert cuda.cuMemUnmap(va, size) == 0
    assert cuda.cuMemAddressFree(va, size) == 0
    retained.append(again)
    steps.append(["round", 0, used()])
for handle in retained:
    assert cuda.cuMemRelease(handle) == 0
steps.append(["released", 0, used()])
# A handle retained twice while mapped: released three times in all, unmapped, nothing left.
rc, handle = create()
assert rc == 0
va = mapped(handle)
for _ in range(2):
    assert retain(va.value).value == handle.value
for _ in range(3):
    assert cuda.cuMemRelease(handle) == 0
steps.append(["mapped", 0, used()])
steps.append(["fourth_release", cuda.cuMemRelease(handle), used()])
assert cuda.cuMemUnmap(va, size) == 0
steps.append(["unmapped", 0, used()])
print(json.dumps(steps))
"""


def test_a_retained_vmm_handle_keeps_its_charge_until_released(make_claim: ClaimFactory) -> None:
    """cuMemRetainAllocationHandle is one more reference to the allocation (each retain needs a
    cuMemRelease of its own): releasing the creating handle and unmapping leaves the memory with
    the retained handle, and the charge with it - so rounds of create, map, retain, release,
    unmap are refused at the limit (256 MiB: the fifth 64 MiB allocation is
    CUDA_ERROR_OUT_OF_MEMORY), and releasing the retained handles gives everything back; a handle
    retained twice needs three releases."""
    done = make_claim(**CUDA13).python(RETAIN)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == [
        ["round", 0, 64 * MiB],
        ["round", 0, 128 * MiB],
        ["round", 0, 192 * MiB],
        ["round", 0, 256 * MiB],
        ["create", 2, 256 * MiB],
        ["released", 0, 0],
        ["mapped", 0, 64 * MiB],
        ["fourth_release", 1, 64 * MiB],
        ["unmapped", 0, 0],
    ]
