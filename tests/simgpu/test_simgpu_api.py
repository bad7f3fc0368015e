"""The CUDA driver API and NVML subsets behave like the real driver's, call by call, including
their error codes; entry points the simulator lacks answer "not supported" instead of crashing."""

from __future__ import annotations

from pathlib import Path

import pytest

from simgpu.node import NodeFactory

IMAGES = Path(__file__).parent / "images"
"""Cubins of the test programs' sleep kernel (see images/README.md)."""


def test_cuda_driver_api_conformance(make_node: NodeFactory) -> None:
    """tests/simgpu/programs/cuda_api.c passes: init, devices, contexts, memory (plain, pitched,
    managed, pinned host, async, pools, VMM, arrays, which die with their context; a pool
    reserves in 2 MiB-aligned chunks and suballocates, keeps freed memory reserved, on the device
    too, until a sync trims whole unused chunks to its release threshold or cuMemPoolTrimTo does,
    and reuses it), modules,
    launches, events, graphs, stream capture (launches recorded into a graph, not run), the
    per-thread default stream of the _ptsz/_ptds entry points, and
    cuGetProcAddress in all three signatures honouring the requested version and stream flags,
    each with its failure paths."""
    done = make_node(name="cuda").program("cuda_api")
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines()[-1] == "PASS"


def test_nvml_conformance(make_node: NodeFactory) -> None:
    """tests/simgpu/programs/nvml_api.c passes: init/shutdown, handles, buffer-size errors,
    versioned structs and the uninitialised state."""
    done = make_node(name="nvml").program("nvml_api")
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines()[-1] == "PASS"


def test_null_arguments_and_invalid_handles(make_node: NodeFactory) -> None:
    """tests/simgpu/programs/error_paths.c passes: every CUDA and NVML entry point given a NULL
    output, a NULL or out-of-range handle, or called before init / without a context returns
    NVIDIA's error code for it (table-driven, one row per call)."""
    done = make_node(name="errors").program("error_paths")
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines()[-1] == "PASS"


def test_proc_address_refuses_abis_older_than_simulated(make_node: NodeFactory) -> None:
    """The simulator has no pre-CUDA-3.2 (32-bit size) ABIs: asking for cuMemAlloc at 3010 is
    CUDA_ERROR_NOT_FOUND with CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT and a NULL pointer,
    never the 64-bit function under the old ABI (a real driver returns its v1 function). Flags
    other than DEFAULT, LEGACY_STREAM and PER_THREAD_DEFAULT_STREAM are CUDA_ERROR_INVALID_VALUE."""
    seen = make_node(name="procabi").python_json(
        """
import ctypes, json
cu = ctypes.CDLL("libcuda.so.1")
def query(name, version, flags):
    fn = ctypes.c_void_p(1)
    status = ctypes.c_int(-1)
    rc = cu.cuGetProcAddress_v2(name, ctypes.byref(fn), version, ctypes.c_uint64(flags),
                                ctypes.byref(status))
    return [rc, status.value, fn.value]
print(json.dumps(dict(
    v1=query(b"cuMemAlloc", 3010, 0), v2=query(b"cuMemAlloc", 3020, 0)[:2],
    both_flags=query(b"cuLaunchKernel", 12000, 3)[0], bad_flag=query(b"cuLaunchKernel", 12000, 4)[0])))
"""
    )
    assert seen == {"v1": [500, 2, None], "v2": [0, 0], "both_flags": 1, "bad_flag": 1}


def test_unimplemented_entry_points_report_not_supported(make_node: NodeFactory) -> None:
    """A real driver entry point the simulator does not implement resolves (through dlsym and
    through cuGetProcAddress) and returns CUDA_ERROR_NOT_SUPPORTED - conditional graph handles
    (cuGraphConditionalHandleCreate) among them, the refusal CUDA documents for it; NVML's return
    NVML_ERROR_NOT_SUPPORTED, which pynvml raises as NVMLError_NotSupported."""
    seen = make_node(name="stubs").python_json(
        """
import ctypes, json, pynvml as n
cu = ctypes.CDLL("libcuda.so.1")
cu.cuInit(0)
fn = ctypes.c_void_p()
status = ctypes.c_int(-1)
found = cu.cuGetProcAddress_v2(b"cuMemcpy2D", ctypes.byref(fn), 12000, 0, ctypes.byref(status))
n.nvmlInit()
try:
    n.nvmlDeviceGetPersistenceMode(n.nvmlDeviceGetHandleByIndex(0))
    mig = "supported"
except n.NVMLError_NotSupported:
    mig = "not supported"
print(json.dumps(dict(
    direct=cu.cuMemcpy2D_v2(None), found=found, status=status.value,
    conditional=cu.cuGraphConditionalHandleCreate(ctypes.byref(fn), None, None, 0, 0),
    via_proc=ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p)(fn.value)(None), mig=mig)))
"""
    )
    assert seen == {
        "direct": 801,
        "found": 0,
        "status": 0,
        "via_proc": 801,
        "conditional": 801,
        "mig": "not supported",
    }


def test_forked_child_cannot_use_the_parents_driver(make_node: NodeFactory) -> None:
    """As with the real driver, a child forked after cuInit gets CUDA_ERROR_NOT_INITIALIZED from
    the inherited library instead of corrupting the parent's state."""
    seen = make_node(name="fork").python_json(
        """
import ctypes, json, os
cu = ctypes.CDLL("libcuda.so.1")
assert cu.cuInit(0) == 0
r, w = os.pipe()
pid = os.fork()
if pid == 0:
    n = ctypes.c_int()
    os.write(w, str(cu.cuDeviceGetCount(ctypes.byref(n))).encode())
    os._exit(0)
os.waitpid(pid, 0)
print(json.dumps(int(os.read(r, 16))))
"""
    )
    assert seen == 3


def test_ipc_shareable_handles_and_peer_access(make_node: NodeFactory) -> None:
    """tests/simgpu/programs/sharing_api.c passes on a two-GPU node: a forked process opens the
    other's IPC handle (twice: one pointer, two references) and imports its exported VMM
    descriptor, reads and writes the same bytes, and counts nothing on the device; every error
    path of the IPC, export/import and peer calls answers its documented code; a freed
    allocation's handle no longer opens, and nothing is left beside the state file."""
    node = make_node(gpus=2, name="sharing")
    done = node.program("sharing_api")
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines()[-1] == "PASS"
    assert sorted(p.name for p in node.spec.state_file.parent.iterdir()) == ["simgpu.conf", "state"]


@pytest.mark.parametrize(
    ("driver_version", "cuda_driver_version"), [("550.54.15", 12040), ("580.65.06", 13000)]
)
def test_cuda13_entry_points_follow_the_configured_driver_version(
    make_node: NodeFactory, driver_version: str, cuda_driver_version: int
) -> None:
    """tests/simgpu/programs/cuda13_api.c passes on a CUDA 12.4 and a CUDA 13.0 node:
    cuGetProcAddress answers only what a driver of the configured version has (a version above
    it is CUDA_ERROR_INVALID_VALUE; a name introduced after it, CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND),
    before cuInit as after; a CUDA 13 driver gives cuCtxSynchronize_v2 and cuCtxGetDevice_v2 (for
    any context, not only the current one), cuStreamGetCtx_v2 (no green context) and the
    location-named pools (host and managed pools: CUDA_ERROR_NOT_SUPPORTED);
    cuMemRetainAllocationHandle returns the handle behind any mapped address with a reference of
    its own, and cuMemGetAllocationPropertiesFromHandle what the handle was created with."""
    node = make_node(
        gpus=2,
        name=f"cuda{cuda_driver_version}",
        driver_version=driver_version,
        cuda_driver_version=cuda_driver_version,
    )
    done = node.program("cuda13_api", str(cuda_driver_version))
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines()[-1] == "PASS"


def test_nvml_answers_the_queries_cuda13_clients_make(make_node: NodeFactory) -> None:
    """What nvidia-ml-py 13 and cuda.core's system module ask a CUDA 13 node: the driver branch
    (named after the driver version's major number), the versioned PCI query (v3's fields and the
    3D-controller class), the addressing mode (neither HMM nor ATS), each refusing a struct of
    another version with NVML_ERROR_ARGUMENT_VERSION_MISMATCH, a NULL one or a NULL device with
    NVML_ERROR_INVALID_ARGUMENT, and NVML_ERROR_UNINITIALIZED before nvmlInit; the board's module
    id is not simulated (NVML_ERROR_NOT_SUPPORTED)."""
    node = make_node(name="nvml13", driver_version="580.65.06", cuda_driver_version=13000)
    seen = node.python_json(
        """
import ctypes, json
nvml = ctypes.CDLL("libnvidia-ml.so.1")
def version(struct, v):
    return ctypes.sizeof(struct) | (v << 24)
class Branch(ctypes.Structure):
    _fields_ = [("version", ctypes.c_uint), ("branch", ctypes.c_char * 80)]
class PciExt(ctypes.Structure):
    _fields_ = [("version", ctypes.c_uint), ("domain", ctypes.c_uint), ("bus", ctypes.c_uint),
                ("device", ctypes.c_uint), ("pciDeviceId", ctypes.c_uint),
                ("pciSubSystemId", ctypes.c_uint), ("baseClass", ctypes.c_uint),
                ("subClass", ctypes.c_uint), ("busId", ctypes.c_char * 32)]
class Mode(ctypes.Structure):
    _fields_ = [("version", ctypes.c_uint), ("value", ctypes.c_uint)]
branch = Branch(version(Branch, 1))
uninitialised = nvml.nvmlSystemGetDriverBranch(ctypes.byref(branch), 80)
assert nvml.nvmlInit_v2() == 0
dev = ctypes.c_void_p()
assert nvml.nvmlDeviceGetHandleByIndex_v2(0, ctypes.byref(dev)) == 0
pci = PciExt(version(PciExt, 1))
mode = Mode(version(Mode, 1))
cuda = ctypes.c_int()
out = dict(
    uninitialised=uninitialised,
    branch=[nvml.nvmlSystemGetDriverBranch(ctypes.byref(branch), 80), branch.branch.decode()],
    branch_short=nvml.nvmlSystemGetDriverBranch(ctypes.byref(branch), 4),
    branch_old=nvml.nvmlSystemGetDriverBranch(ctypes.byref(Branch(version(Branch, 2))), 80),
    branch_null=nvml.nvmlSystemGetDriverBranch(None, 80),
    cuda_v2=[nvml.nvmlSystemGetCudaDriverVersion_v2(ctypes.byref(cuda)), cuda.value],
    pci=[nvml.nvmlDeviceGetPciInfoExt(dev, ctypes.byref(pci)), pci.busId.decode(), pci.bus,
         hex(pci.pciDeviceId), pci.baseClass, pci.subClass],
    pci_old=nvml.nvmlDeviceGetPciInfoExt(dev, ctypes.byref(PciExt(version(PciExt, 2)))),
    pci_null=nvml.nvmlDeviceGetPciInfoExt(dev, None),
    pci_no_device=nvml.nvmlDeviceGetPciInfoExt(None, ctypes.byref(pci)),
    mode_no_device=nvml.nvmlDeviceGetAddressingMode(None, ctypes.byref(mode)),
    mode=[nvml.nvmlDeviceGetAddressingMode(dev, ctypes.byref(mode)), mode.value],
    mode_old=nvml.nvmlDeviceGetAddressingMode(dev, ctypes.byref(Mode(0))),
    module=nvml.nvmlDeviceGetModuleId(dev, ctypes.byref(ctypes.c_uint())),
)
print(json.dumps(out))
"""
    )
    assert seen == {
        "uninitialised": 1,  # NVML_ERROR_UNINITIALIZED
        "branch": [0, "r580_00"],
        "branch_short": 7,  # NVML_ERROR_INSUFFICIENT_SIZE
        "branch_old": 25,  # NVML_ERROR_ARGUMENT_VERSION_MISMATCH
        "branch_null": 2,  # NVML_ERROR_INVALID_ARGUMENT
        "cuda_v2": [0, 13000],
        "pci": [0, "00000000:01:00.0", 1, "0x233010de", 3, 2],
        "pci_old": 25,
        "pci_null": 2,
        "pci_no_device": 2,
        "mode_no_device": 2,
        "mode": [0, 0],
        "mode_old": 25,
        "module": 3,  # NVML_ERROR_NOT_SUPPORTED
    }


def test_streams_libraries_images_and_pointers_serve_cuda_python(make_node: NodeFactory) -> None:
    """tests/simgpu/programs/launch_api.c passes: what cuda.core and numba-cuda need to create
    streams, load code and launch. Stream priorities range from 0 to -5 (clamped, default 0),
    streams report their flags and stable unique ids, contexts theirs; a library's kernel is one
    handle per name, unknown names are CUDA_ERROR_NOT_FOUND, its function in each context
    belongs to the library's module there, its attributes are its functions', and a CUkernel
    launches like a CUfunction and occupies the GPU for the kernel's duration; PTX, cubin and
    fatbin images are read for their entry functions, a cubin for another architecture (alone
    or as a fatbin's only code) is CUDA_ERROR_NO_BINARY_FOR_GPU and a truncated one
    CUDA_ERROR_INVALID_IMAGE; kernel parameter layouts come from PTX's .param list (aligned as
    the ABI does) and from a cubin's .nv.info section; pointer attributes describe device,
    managed, pinned host and pool memory, and memory CUDA does not know is an error singly and
    defaults (ordinal -2) in bulk; occupancy answers are plausible for an H100; every new entry
    point resolves at the CUDA version cuda-python asks for it, on a CUDA 12.9 node
    (cuStreamGetDevice is 12.8's)."""
    node = make_node(name="launch", driver_version="575.57.08", cuda_driver_version=12090)
    done = node.program("launch_api", str(IMAGES))
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines()[-1] == "PASS"


def test_malformed_images_are_refused_each_in_its_own_way(make_node: NodeFactory) -> None:
    """tests/simgpu/programs/image_formats.c passes: a cubin for another machine or class, with
    bad section headers, a symbol table out of bounds, without strings, with a wrong symbol
    size, unterminated strings or a kernel name outside them, or cut short is
    CUDA_ERROR_INVALID_IMAGE, as is a fatbin of another version, cut short, with a too small
    or too large entry, or whose PTX entry is not (terminated) PTX; an .entry without a name is
    CUDA_ERROR_INVALID_PTX, and a directive in a comment names nothing. Bad section names or an
    .nv.info section outside the file are CUDA_ERROR_INVALID_IMAGE; a kernel without one, a
    record the reader cannot size or a PTX parameter list it does not read leave the parameters
    unknown (CUDA_ERROR_NOT_SUPPORTED). The documented leniencies hold: a compressed fatbin
    entry and text in no known format resolve any name, and nvcc's fatbin wrapper is followed
    (one pointing nowhere, or at anything but a fatbin, is refused)."""
    done = make_node(name="images").program("image_formats", str(IMAGES))
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines()[-1] == "PASS"


def test_graph_memory_nodes_take_device_memory_at_launch_and_keep_it_cached_until_trimmed(
    make_node: NodeFactory,
) -> None:
    """tests/simgpu/programs/graph_mem_api.c passes: an allocation node's address is fixed when
    it is added and costs nothing until the graph launches; launched, its memory counts on the
    device (cuMemGetInfo, CU_GRAPH_MEM_ATTR_USED_MEM_*) and is usable; a free node, cuMemFree or
    cuMemFreeAsync gives it to the device's graph memory cache, which keeps it reserved
    (RESERVED_MEM_*, cuMemGetInfo) through graph and executable destruction until
    cuDeviceGraphMemTrim; a free node in another graph frees it, after the allocating graph and
    executable are gone; an executable whose allocation is still live cannot be relaunched
    (CUDA_ERROR_INVALID_VALUE), a graph with memory nodes has one executable at a time, and a
    launch beyond the device is CUDA_ERROR_OUT_OF_MEMORY, taking nothing. cuGraphAddNode(_v2)
    adds the same nodes (other types are CUDA_ERROR_NOT_SUPPORTED, edge data is refused),
    captured cuMemAllocAsync/cuMemFreeAsync become them (freeing in a capture what no graph
    allocated is CUDA_ERROR_INVALID_VALUE, and an executable with memory nodes is not launched
    into a capture), cuGraphGetNodes fills no more than it has room for, and only the high-water
    marks can be reset."""
    done = make_node(name="graphmem").program("graph_mem_api")
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines()[-1] == "PASS"
