/*
 * A libcuda.so.1 that does nothing: every call returns at once, allocations hand out fresh
 * addresses from a counter and frees accept anything. The simulated driver's own calls take
 * microseconds and swing by more than the shim adds; behind this stub what a hook costs is
 * nearly all of what is measured. Only the entry points the shim requires (real.h) and those
 * `shim_probe bench` calls exist; one GPU, whose UUID overhead.py names (STUB_UUID there).
 */
#include <string.h>

#include "cuda_driver_abi.h"

#define API __attribute__((visibility("default")))
#define TOTAL_BYTES (80ULL << 30)
#define CONTEXT ((CUcontext)0x1000)

static const unsigned char uuid_bytes[16] = {0x5a, 0x5a, 0x5a, 0x5a, 0, 0, 0, 0,
                                             0, 0, 0, 0, 0, 0, 0, 1};
static CUdeviceptr next_address = 1ULL << 40;

API CUresult cuInit(unsigned int flags)
{
    (void)flags;
    return CUDA_SUCCESS;
}

API CUresult cuGetProcAddress(const char *symbol, void **pfn, int cudaVersion, cuuint64_t flags)
{
    (void)symbol, (void)cudaVersion, (void)flags;
    *pfn = NULL;
    return CUDA_ERROR_NOT_FOUND;
}

API CUresult cuDeviceGetCount(int *count)
{
    *count = 1;
    return CUDA_SUCCESS;
}

API CUresult cuDeviceGet(CUdevice *device, int ordinal)
{
    if (ordinal != 0)
        return CUDA_ERROR_INVALID_DEVICE;
    *device = 0;
    return CUDA_SUCCESS;
}

API CUresult cuDeviceGetUuid(CUuuid *uuid, CUdevice dev)
{
    (void)dev;
    memcpy(uuid->bytes, uuid_bytes, sizeof uuid_bytes);
    return CUDA_SUCCESS;
}

API CUresult cuDeviceTotalMem_v2(size_t *bytes, CUdevice dev)
{
    (void)dev;
    *bytes = TOTAL_BYTES;
    return CUDA_SUCCESS;
}

API CUresult cuCtxGetCurrent(CUcontext *pctx)
{
    *pctx = CONTEXT;
    return CUDA_SUCCESS;
}

API CUresult cuCtxSetCurrent(CUcontext ctx)
{
    (void)ctx;
    return CUDA_SUCCESS;
}

API CUresult cuCtxGetDevice(CUdevice *device)
{
    *device = 0;
    return CUDA_SUCCESS;
}

API CUresult cuCtxDestroy_v2(CUcontext ctx)
{
    (void)ctx;
    return CUDA_SUCCESS;
}

API CUresult cuCtxSynchronize(void)
{
    return CUDA_SUCCESS;
}

API CUresult cuDevicePrimaryCtxRetain(CUcontext *pctx, CUdevice dev)
{
    (void)dev;
    *pctx = CONTEXT;
    return CUDA_SUCCESS;
}

API CUresult cuDevicePrimaryCtxGetState(CUdevice dev, unsigned int *flags, int *active)
{
    (void)dev;
    *flags = 0;
    *active = 1;
    return CUDA_SUCCESS;
}

API CUresult cuMemGetInfo_v2(size_t *free_bytes, size_t *total_bytes)
{
    *free_bytes = TOTAL_BYTES;
    *total_bytes = TOTAL_BYTES;
    return CUDA_SUCCESS;
}

API CUresult cuMemAlloc_v2(CUdeviceptr *dptr, size_t bytesize)
{
    *dptr = __atomic_fetch_add(&next_address, (bytesize + 511) / 512 * 512 + 512,
                               __ATOMIC_RELAXED);
    return CUDA_SUCCESS;
}

API CUresult cuMemAllocPitch_v2(CUdeviceptr *dptr, size_t *pitch, size_t widthInBytes,
                                size_t height, unsigned int elementSizeBytes)
{
    (void)elementSizeBytes;
    *pitch = (widthInBytes + 511) / 512 * 512;
    return cuMemAlloc_v2(dptr, *pitch * height);
}

API CUresult cuMemFree_v2(CUdeviceptr dptr)
{
    (void)dptr;
    return CUDA_SUCCESS;
}

API CUresult cuLaunchKernel(CUfunction f, unsigned int gridDimX, unsigned int gridDimY,
                            unsigned int gridDimZ, unsigned int blockDimX, unsigned int blockDimY,
                            unsigned int blockDimZ, unsigned int sharedMemBytes, CUstream stream,
                            void **kernelParams, void **extra)
{
    (void)f, (void)gridDimX, (void)gridDimY, (void)gridDimZ, (void)blockDimX, (void)blockDimY;
    (void)blockDimZ, (void)sharedMemBytes, (void)stream, (void)kernelParams, (void)extra;
    return CUDA_SUCCESS;
}

API CUresult cuEventCreate(CUevent *event, unsigned int flags)
{
    (void)flags;
    *event = (CUevent)0x2000;
    return CUDA_SUCCESS;
}

API CUresult cuEventRecord(CUevent event, CUstream stream)
{
    (void)event, (void)stream;
    return CUDA_SUCCESS;
}

API CUresult cuEventQuery(CUevent event)
{
    (void)event;
    return CUDA_SUCCESS;
}

API CUresult cuEventElapsedTime(float *ms, CUevent start, CUevent end)
{
    (void)start, (void)end;
    *ms = 0.0f;
    return CUDA_SUCCESS;
}

API CUresult cuEventDestroy_v2(CUevent event)
{
    (void)event;
    return CUDA_SUCCESS;
}

API CUresult cuModuleLoadData(CUmodule *module, const void *image)
{
    (void)image;
    *module = (CUmodule)0x3000;
    return CUDA_SUCCESS;
}

API CUresult cuModuleGetFunction(CUfunction *hfunc, CUmodule module, const char *name)
{
    (void)module, (void)name;
    *hfunc = (CUfunction)0x4000;
    return CUDA_SUCCESS;
}

API CUresult cuGraphCreate(CUgraph *graph, unsigned int flags)
{
    (void)flags;
    *graph = (CUgraph)0x5000;
    return CUDA_SUCCESS;
}

API CUresult cuGraphAddKernelNode_v2(CUgraphNode *node, CUgraph graph, const CUgraphNode *deps,
                                     size_t numDeps, const CUDA_KERNEL_NODE_PARAMS_v2 *params)
{
    (void)graph, (void)deps, (void)numDeps, (void)params;
    *node = (CUgraphNode)0x6000;
    return CUDA_SUCCESS;
}

API CUresult cuGraphInstantiateWithFlags(CUgraphExec *exec, CUgraph graph,
                                         unsigned long long flags)
{
    (void)graph, (void)flags;
    *exec = (CUgraphExec)0x7000;
    return CUDA_SUCCESS;
}

API CUresult cuGraphLaunch(CUgraphExec exec, CUstream stream)
{
    (void)exec, (void)stream;
    return CUDA_SUCCESS;
}
