/*
 * Real driver entry points the simulator does not implement. They exist (for dlsym and
 * cuGetProcAddress) and report CUDA_ERROR_NOT_SUPPORTED, so a program that probes for optional
 * features sees a clean error instead of a missing symbol or a crash. Each name is an alias of
 * one function that ignores its arguments, which is safe under the x86-64 and AArch64 C calling
 * conventions (the caller owns argument cleanup).
 */
#include <string.h>

#include "cuda_internal.h"

#define SIM_CUDA_STUBS(X)                                                                         \
    X(cuCtxGetLimit) X(cuCtxSetLimit) X(cuCtxGetCacheConfig) X(cuCtxSetCacheConfig)               \
    X(cuCtxGetSharedMemConfig) X(cuCtxSetSharedMemConfig)          \
    X(cuCtxResetPersistingL2Cache) X(cuCtxGetExecAffinity)                          \
                      \
    X(cuDeviceGetP2PAttribute) X(cuDeviceGetLuid) X(cuDeviceGetProperties)                        \
    X(cuDeviceGetTexture1DLinearMaxWidth) X(cuDeviceGetNvSciSyncAttributes)                       \
    X(cuDeviceGetExecAffinitySupport) X(cuFlushGPUDirectRDMAWrites) X(cuModuleGetGlobal_v2)       \
    X(cuModuleGetTexRef) X(cuModuleGetSurfRef)                           \
    X(cuModuleGetLoadingMode) X(cuLinkCreate_v2) X(cuLinkAddData_v2) X(cuLinkAddFile_v2)          \
    X(cuLinkComplete) X(cuLinkDestroy)              \
    X(cuLibraryGetGlobal)          \
    X(cuMemHostAlloc)      \
    X(cuMemHostGetDevicePointer_v2) X(cuMemHostGetFlags) X(cuMemHostRegister_v2)                  \
    X(cuMemHostUnregister)   \
    X(cuIpcGetEventHandle) X(cuIpcOpenEventHandle)           \
    X(cuMemcpy2D_v2) X(cuMemcpy2DAsync_v2) X(cuMemcpy2DUnaligned_v2) X(cuMemcpy3D_v2)             \
    X(cuMemcpy3DAsync_v2) X(cuMemcpyDtoDAsync_v2) X(cuMemcpyHtoA_v2) X(cuMemcpyAtoH_v2)           \
    X(cuMemsetD16_v2) X(cuMemsetD16Async) X(cuMemsetD2D8_v2) X(cuMemsetD2D16_v2)                  \
    X(cuMemsetD2D32_v2) X(cuMemPrefetchAsync) X(cuMemAdvise) X(cuMemRangeGetAttribute)            \
    X(cuPointerSetAttribute)                   \
    X(cuMemGetAccess)           \
    X(cuMemPoolSetAccess) X(cuMemPoolGetAccess) X(cuMemPoolExportToShareableHandle)               \
    X(cuMemPoolImportFromShareableHandle) X(cuMemPoolExportPointer) X(cuMemPoolImportPointer)     \
    X(cuStreamAddCallback)            \
    X(cuStreamAttachMemAsync)                                                                    \
    X(cuStreamGetCaptureInfo_v2) X(cuStreamGetAttribute)                                          \
    X(cuStreamSetAttribute) X(cuStreamCopyAttributes) X(cuStreamWaitValue32_v2)                   \
    X(cuStreamWriteValue32_v2) X(cuStreamBatchMemOp_v2) X(cuEventRecordWithFlags)                 \
    X(cuLaunchHostFunc) X(cuLaunchCooperativeKernelMultiDevice)           \
    X(cuFuncSetSharedMemConfig)                               \
                                                   \
      \
    X(cuGraphAddMemcpyNode) X(cuGraphAddMemsetNode)    \
    X(cuGraphAddEmptyNode) X(cuGraphAddHostNode) X(cuGraphClone)                                   \
    X(cuGraphExecKernelNodeSetParams_v2) X(cuGraphExecUpdate_v2) X(cuGraphUpload)                 \
    X(cuGraphKernelNodeGetParams_v2) X(cuGraphKernelNodeSetParams_v2) X(cuTexObjectCreate)        \
    X(cuTexObjectDestroy) X(cuSurfObjectCreate) X(cuSurfObjectDestroy) X(cuImportExternalMemory)  \
    X(cuExternalMemoryGetMappedBuffer) X(cuDestroyExternalMemory) X(cuImportExternalSemaphore)    \
    X(cuSignalExternalSemaphoresAsync) X(cuWaitExternalSemaphoresAsync)                           \
    X(cuDestroyExternalSemaphore) X(cuProfilerStart) X(cuProfilerStop) X(cuGetExportTable)        \
    X(cuCoredumpGetAttribute) X(cuThreadExchangeStreamCaptureMode) X(cuUserObjectCreate)          \
    X(cuGraphConditionalHandleCreate)

/* Their per-thread default stream variants, exported for dlsym; cuGetProcAddress answers the
 * base name with the same function whatever its flags. */
#define SIM_CUDA_STUB_VARIANTS(X)                                                                 \
    X(cuMemcpy2D_v2_ptds) X(cuMemcpy2DUnaligned_v2_ptds) X(cuMemcpy3D_v2_ptds)                    \
    X(cuMemcpyHtoA_v2_ptds) X(cuMemcpyAtoH_v2_ptds)                          \
    X(cuMemsetD16_v2_ptds) X(cuMemsetD2D8_v2_ptds) X(cuMemsetD2D16_v2_ptds)                       \
    X(cuMemsetD2D32_v2_ptds) X(cuMemcpyDtoDAsync_v2_ptsz) X(cuMemcpy2DAsync_v2_ptsz)              \
    X(cuMemcpy3DAsync_v2_ptsz) X(cuMemsetD16Async_ptsz)                 \
    X(cuMemPrefetchAsync_ptsz)               \
    X(cuStreamAddCallback_ptsz) X(cuStreamAttachMemAsync_ptsz)              \
    X(cuStreamGetCaptureInfo_v2_ptsz) X(cuStreamGetAttribute_ptsz) X(cuStreamSetAttribute_ptsz)   \
    X(cuStreamCopyAttributes_ptsz) X(cuStreamWaitValue32_v2_ptsz) X(cuStreamWriteValue32_v2_ptsz) \
    X(cuStreamBatchMemOp_v2_ptsz) X(cuEventRecordWithFlags_ptsz) X(cuLaunchHostFunc_ptsz)         \
    X(cuSignalExternalSemaphoresAsync_ptsz) X(cuWaitExternalSemaphoresAsync_ptsz)                 \
    X(cuGraphUpload_ptsz)

static CUresult not_supported(void)
{
    return CUDA_ERROR_NOT_SUPPORTED;
}

#define DEFINE_STUB(name)                                                                         \
    extern __typeof__(not_supported) name                                                         \
        __attribute__((alias("not_supported"), visibility("default")));
SIM_CUDA_STUBS(DEFINE_STUB)
SIM_CUDA_STUB_VARIANTS(DEFINE_STUB)

#define STUB_NAME(name) #name,
static const char *const stub_names[] = {SIM_CUDA_STUBS(STUB_NAME)};

/* cuGetProcAddress asks for base names ("cuMemcpy2D"); the stubs carry versioned ones. */
void *sim_cuda_stub_lookup(const char *symbol)
{
    size_t len = strlen(symbol);
    for (size_t i = 0; i < sizeof stub_names / sizeof stub_names[0]; i++) {
        const char *n = stub_names[i];
        if (strncmp(n, symbol, len) == 0 && (n[len] == '\0' || strcmp(n + len, "_v2") == 0))
            return (void *)not_supported;
    }
    return NULL;
}
