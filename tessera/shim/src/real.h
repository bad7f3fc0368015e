/*
 * The real driver's entry points, as the shim calls them. Each is resolved from the real library
 * (the alias libcuda-real.so.1 the shim was linked against; see docs/shim.md) when the shim
 * initialises; cuGetProcAddress may fill those the library does not export by name (X_OPT).
 * Types come from the ABI header, so a hook and the function it wraps cannot disagree.
 */
#ifndef TESSERA_REAL_H
#define TESSERA_REAL_H

#include "cuda_driver_abi.h"

/* X(name): required by the shim's own work; X_OPT(name): wrapped if the driver has it. The
 * three an allocation and its free call are also copied onto the shim state's first line
 * (shim_state.h: struct shim_hot_calls), where the hot path reads them. */
#define SHIM_CUDA_ENTRY_POINTS(X, X_OPT)                                                          \
    X(cuCtxGetCurrent)                                                                            \
    X(cuMemAlloc_v2)                                                                              \
    X(cuMemFree_v2)                                                                               \
    X(cuInit)                                                                                     \
    X(cuGetProcAddress)                                                                           \
    X_OPT(cuGetProcAddress_v2)                                                                    \
    X_OPT(cuGetProcAddress_v2_ptsz)                                                               \
    X(cuDeviceGetCount)                                                                           \
    X(cuDeviceGet)                                                                                \
    X(cuDeviceGetUuid)                                                                            \
    X(cuDeviceTotalMem_v2)                                                                        \
    X(cuCtxGetDevice)                                                                             \
    X(cuCtxDestroy_v2)                                                                            \
    X(cuDevicePrimaryCtxRetain)                                                                   \
    X_OPT(cuDevicePrimaryCtxRelease)                                                              \
    X_OPT(cuDevicePrimaryCtxRelease_v2)                                                           \
    X_OPT(cuDevicePrimaryCtxReset)                                                                \
    X_OPT(cuDevicePrimaryCtxReset_v2)                                                             \
    X(cuDevicePrimaryCtxGetState)                                                                 \
    X(cuMemGetInfo_v2)                                                                            \
    X(cuMemAllocPitch_v2)                                                                         \
    X_OPT(cuMemAllocManaged)                                                                      \
    X_OPT(cuMemAllocAsync)                                                                        \
    X_OPT(cuMemAllocAsync_ptsz)                                                                   \
    X_OPT(cuMemFreeAsync)                                                                         \
    X_OPT(cuMemFreeAsync_ptsz)                                                                    \
    X_OPT(cuMemAllocFromPoolAsync)                                                                \
    X_OPT(cuMemAllocFromPoolAsync_ptsz)                                                           \
    X_OPT(cuMemPoolCreate)                                                                        \
    X_OPT(cuMemPoolDestroy)                                                                       \
    X_OPT(cuMemPoolTrimTo)                                                                        \
    X_OPT(cuMemPoolGetAttribute)                                                                  \
    X_OPT(cuDeviceGetMemPool)                                                                     \
    X_OPT(cuMemCreate)                                                                            \
    X_OPT(cuMemRelease)                                                                           \
    X_OPT(cuMemRetainAllocationHandle)                                                            \
    X_OPT(cuMemImportFromShareableHandle)                                                         \
    X_OPT(cuMemMap)                                                                               \
    X_OPT(cuMemUnmap)                                                                             \
    X_OPT(cuArrayCreate_v2)                                                                       \
    X_OPT(cuArray3DCreate_v2)                                                                     \
    X_OPT(cuArrayDestroy)                                                                         \
    X(cuLaunchKernel)                                                                             \
    X_OPT(cuLaunchKernel_ptsz)                                                                    \
    X_OPT(cuLaunchKernelEx)                                                                       \
    X_OPT(cuLaunchKernelEx_ptsz)                                                                  \
    X_OPT(cuLaunchCooperativeKernel)                                                              \
    X_OPT(cuLaunchCooperativeKernel_ptsz)                                                         \
    X_OPT(cuGraphLaunch)                                                                          \
    X_OPT(cuGraphLaunch_ptsz)                                                                     \
    X_OPT(cuStreamIsCapturing)                                                                    \
    X_OPT(cuStreamIsCapturing_ptsz)                                                               \
    X_OPT(cuStreamBeginCapture)                                                                   \
    X_OPT(cuStreamBeginCapture_ptsz)                                                              \
    X_OPT(cuStreamBeginCapture_v2)                                                                \
    X_OPT(cuStreamBeginCapture_v2_ptsz)                                                           \
    X_OPT(cuStreamBeginCaptureToGraph)                                                            \
    X_OPT(cuStreamBeginCaptureToGraph_ptsz)                                                       \
    X_OPT(cuStreamBeginCaptureToCig)                                                              \
    X_OPT(cuStreamBeginRecaptureToGraph)                                                          \
    X_OPT(cuGraphInstantiate)                                                                     \
    X_OPT(cuGraphInstantiate_v2)                                                                  \
    X_OPT(cuGraphInstantiateWithFlags)                                                            \
    X_OPT(cuGraphInstantiateWithParams)                                                           \
    X_OPT(cuGraphInstantiateWithParams_ptsz)                                                      \
    X_OPT(cuGraphExecDestroy)                                                                     \
    X_OPT(cuGraphGetNodes)                                                                        \
    X_OPT(cuGraphNodeGetType)                                                                     \
    X_OPT(cuGraphMemAllocNodeGetParams)                                                           \
    X_OPT(cuDeviceGetGraphMemAttribute)                                                           \
    X_OPT(cuDeviceGraphMemTrim)                                                                   \
    X_OPT(cuMipmappedArrayCreate)                                                                 \
    X(cuEventCreate)                                                                              \
    X(cuEventRecord)                                                                              \
    X(cuEventQuery)                                                                               \
    X(cuEventElapsedTime)                                                                         \
    X(cuEventDestroy_v2)                                                                          \
    X_OPT(cuMemAlloc)                                                                             \
    X_OPT(cuMemAllocPitch)                                                                        \
    X_OPT(cuArrayCreate)                                                                          \
    X_OPT(cuArray3DCreate)                                                                        \
    X_OPT(cuMemGetInfo)                                                                           \
    X_OPT(cuDeviceTotalMem)

struct shim_real {
#define SHIM_REAL_FIELD(name) __typeof__(&name) name;
    SHIM_CUDA_ENTRY_POINTS(SHIM_REAL_FIELD, SHIM_REAL_FIELD)
#undef SHIM_REAL_FIELD
} __attribute__((aligned(64)));

extern struct shim_real shim_real;

/* Resolve every entry point from the real library. Returns 0, or -1 if a required one is
 * missing (the reason is logged). */
int shim_real_resolve(void);

#endif
