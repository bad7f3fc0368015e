"""A process of a claim that allocates through one of NVIDIA's Python CUDA clients, one command at
a time (the protocol of tests/shim/programs/shim_slots.c, which testbed.shim_harness.ClaimProcess
speaks), and holds what it allocated until it is killed.

    python client.py API

API: how ``alloc`` allocates - a cuda-bindings driver entry point (cuMemAlloc, cuMemAllocPitch,
cuMemAllocManaged, cuMemAllocAsync on the default pool, cuMemAllocFromPoolAsync on a pool made
here, cuMemCreate mapped with cuMemMap), a cuda.core memory resource (cuda.core.device: the
device's default resource, cuda.core.pool: a resource with a pool of its own, cuda.core.virtual:
the VMM resource), or numba.device_array. With CUDA_PYTHON_CUDA_PER_THREAD_DEFAULT_STREAM=1 in the
environment cuda-bindings resolves the per-thread default stream (_ptsz) entry points.

Commands, each answered with one line of ``key=value`` pairs:

    cuda            start CUDA on device 0 the client's way               rc=
    alloc BYTES     allocate BYTES and hold it                           rc= (a CUresult)
    info            what the driver API and NVML say of device 0's memory
                    total= free= devtotal= nvml_total= nvml_used= nvml_total_v2= nvml_used_v2=
    nvml N GAP_MS   N readings of NVML memory info (v1 and v2), GAP_MS apart
                    used=a,b,.. used_v2=a,b,..
    entry NAME      which of libcuda.so.1's NAME and NAME_ptsz cuda-bindings calls for NAME
                    entry=NAME|NAME_ptsz|other
"""

from __future__ import annotations

import ctypes
import os
import sys
import time
from collections.abc import Callable
from typing import Any

import pynvml
from cuda.bindings import driver

OOM = int(driver.CUresult.CUDA_ERROR_OUT_OF_MEMORY)


class CudaFailure(Exception):
    """A call that returned a CUresult other than CUDA_SUCCESS."""

    def __init__(self, code: int) -> None:
        super().__init__(code)
        self.code = code


def check(result: Any) -> Any:
    """The value(s) of a cuda-bindings call, or CudaFailure with its CUresult."""
    err, *rest = result if isinstance(result, tuple) else (result,)
    if err != driver.CUresult.CUDA_SUCCESS:
        raise CudaFailure(int(err))
    return rest[0] if len(rest) == 1 else tuple(rest) or None


def device_zero() -> Any:
    """Device 0 as a memory location: where pools and VMM allocations place their memory."""
    location = driver.CUmemLocation()
    location.type = driver.CUmemLocationType.CU_MEM_LOCATION_TYPE_DEVICE
    location.id = 0
    return location


class Bindings:
    """cuda-bindings, the driver API as NVIDIA's binding exposes it."""

    def __init__(self, api: str) -> None:
        self.api = api
        self.held: list[object] = []
        self.stream: Any = None
        self.pool: Any = None

    def start(self) -> None:
        check(driver.cuInit(0))
        device = check(driver.cuDeviceGet(0))
        check(driver.cuCtxSetCurrent(check(driver.cuDevicePrimaryCtxRetain(device))))
        self.stream = check(driver.cuStreamCreate(driver.CUstream_flags.CU_STREAM_NON_BLOCKING))
        if self.api == "cuMemAllocFromPoolAsync":
            props = driver.CUmemPoolProps()
            props.allocType = driver.CUmemAllocationType.CU_MEM_ALLOCATION_TYPE_PINNED
            props.location = device_zero()
            self.pool = check(driver.cuMemPoolCreate(props))

    def allocate(self, size: int) -> None:
        allocations: dict[str, Callable[[], object]] = {
            "cuMemAlloc": lambda: check(driver.cuMemAlloc(size)),
            "cuMemAllocPitch": lambda: check(driver.cuMemAllocPitch(size, 1, 4)),
            "cuMemAllocManaged": lambda: check(
                driver.cuMemAllocManaged(size, driver.CUmemAttach_flags.CU_MEM_ATTACH_GLOBAL)
            ),
            "cuMemAllocAsync": lambda: self.synchronised(driver.cuMemAllocAsync(size, self.stream)),
            "cuMemAllocFromPoolAsync": lambda: self.synchronised(
                driver.cuMemAllocFromPoolAsync(size, self.pool, self.stream)
            ),
            "cuMemCreate": lambda: self.mapped(size),
        }
        self.held.append(allocations[self.api]())

    def synchronised(self, result: Any) -> object:
        pointer = check(result)
        check(driver.cuStreamSynchronize(self.stream))
        return pointer

    def mapped(self, size: int) -> object:
        """A VMM allocation as frameworks make one: reserve a range, create, map, grant access."""
        props = driver.CUmemAllocationProp()
        props.type = driver.CUmemAllocationType.CU_MEM_ALLOCATION_TYPE_PINNED
        props.location = device_zero()
        address = check(driver.cuMemAddressReserve(size, 0, 0, 0))
        handle = check(driver.cuMemCreate(size, props, 0))
        check(driver.cuMemMap(address, size, 0, handle, 0))
        access = driver.CUmemAccessDesc()
        access.location = props.location
        access.flags = driver.CUmemAccess_flags.CU_MEM_ACCESS_FLAGS_PROT_READWRITE
        check(driver.cuMemSetAccess(address, size, [access], 1))
        return (address, handle)


class Core:
    """cuda.core: NVIDIA's pythonic layer over cuda-bindings, by memory resource."""

    def __init__(self, api: str) -> None:
        self.api = api
        self.held: list[object] = []
        self.resource: Any = None
        self.stream: Any = None

    def start(self) -> None:
        from cuda.core import (
            Device,
            DeviceMemoryResource,
            DeviceMemoryResourceOptions,
            VirtualMemoryResource,
        )

        device = Device(0)
        device.set_current()
        self.stream = device.default_stream
        if self.api == "cuda.core.device":
            self.resource = device.memory_resource
        elif self.api == "cuda.core.pool":
            self.resource = DeviceMemoryResource(device, DeviceMemoryResourceOptions())
        else:
            self.resource = VirtualMemoryResource(device)

    def allocate(self, size: int) -> None:
        from cuda.core._utils.cuda_utils import CUDAError

        try:
            self.held.append(self.resource.allocate(size, stream=self.stream))
            self.stream.sync()
        except CUDAError as error:
            # cuda.core reports a failed call by its CUresult's name.
            raise CudaFailure(int(getattr(driver.CUresult, str(error).split(":")[0]))) from error


class Numba:
    """numba-cuda: device arrays, allocated by Numba's own memory manager."""

    def __init__(self, api: str) -> None:
        self.held: list[object] = []

    def start(self) -> None:
        from numba import cuda

        cuda.select_device(0)

    def allocate(self, size: int) -> None:
        from numba import cuda
        from numba.cuda.cudadrv.driver import CudaAPIError

        try:
            self.held.append(cuda.device_array(size, dtype="uint8"))
        except CudaAPIError as error:
            raise CudaFailure(int(error.code)) from error


def client(api: str) -> Bindings | Core | Numba:
    if api.startswith("cuda.core."):
        return Core(api)
    if api == "numba.device_array":
        return Numba(api)
    return Bindings(api)


def memory_info() -> str:
    free, total = check(driver.cuMemGetInfo())
    devtotal = check(driver.cuDeviceTotalMem(check(driver.cuDeviceGet(0))))
    pynvml.nvmlInit()
    device = pynvml.nvmlDeviceGetHandleByIndex(0)
    v1 = pynvml.nvmlDeviceGetMemoryInfo(device)
    v2 = pynvml.nvmlDeviceGetMemoryInfo(device, version=pynvml.nvmlMemory_v2)
    return (
        f"total={total} free={free} devtotal={devtotal} nvml_total={v1.total} nvml_used={v1.used} "
        f"nvml_total_v2={v2.total} nvml_used_v2={v2.used}"
    )


def nvml_readings(count: int, gap_ms: int) -> str:
    pynvml.nvmlInit()
    device = pynvml.nvmlDeviceGetHandleByIndex(0)
    used: list[int] = []
    used_v2: list[int] = []
    for i in range(count):
        if i:
            time.sleep(gap_ms / 1000)
        used.append(pynvml.nvmlDeviceGetMemoryInfo(device).used)
        used_v2.append(pynvml.nvmlDeviceGetMemoryInfo(device, version=pynvml.nvmlMemory_v2).used)
    return f"used={','.join(map(str, used))} used_v2={','.join(map(str, used_v2))}"


def entry_point(name: str) -> str:
    """The libcuda.so.1 symbol (plain or _ptsz) at the address cuda-bindings resolved for ``name``
    (through cuGetProcAddress, as the binding does: with the per-thread flag when asked for it).
    The binding's table of resolved pointers is private API, the only way to see its choice."""
    from cuda.bindings._internal import driver as internal

    resolved = internal._inspect_function_pointers()[f"__{name}"]
    library = ctypes.CDLL("libcuda.so.1")
    for symbol in (name, f"{name}_ptsz"):
        if ctypes.cast(getattr(library, symbol), ctypes.c_void_p).value == resolved:
            return symbol
    return "other"


def answer(user: Bindings | Core | Numba, words: list[str]) -> str:
    command, args = words[0], words[1:]
    try:
        if command == "cuda":
            user.start()
            return "rc=0"
        if command == "alloc":
            user.allocate(int(args[0]))
            return "rc=0"
    except CudaFailure as failure:
        return f"rc={failure.code}"
    if command == "info":
        return memory_info()
    if command == "nvml":
        return nvml_readings(int(args[0]), int(args[1]))
    if command == "entry":
        return f"entry={entry_point(args[0])}"
    raise SystemExit(f"unknown command {command!r}")


def main() -> None:
    user = client(sys.argv[1])
    print(f"ready pid={os.getpid()}", flush=True)
    for line in sys.stdin:
        print(answer(user, line.split()), flush=True)


if __name__ == "__main__":
    main()
