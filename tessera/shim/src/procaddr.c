/*
 * cuInit and cuGetProcAddress: the CUDA runtime (and any program) can fetch entry points by base
 * name, a CUDA version and flags, bypassing symbol lookup altogether. The shim asks the real
 * driver first - so whether a symbol exists, and for which versions, is always the driver's
 * answer - and then, if the (name, version, flags) the caller asked for names an ABI the shim
 * hooks, hands out the hook for exactly that ABI:
 *
 *  - version: the table lists each hooked base name with the CUDA version that introduced each
 *    ABI; a request gets the newest not newer than its version (cuMemAlloc at 3020 or later is
 *    cuMemAlloc_v2, before that the 32-bit cuMemAlloc);
 *  - flags: CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM selects the _ptsz flavour where one
 *    exists. The real function the driver returned is what that hook calls, if the shim has
 *    not already resolved that flavour by name.
 *
 * Anything not in the table is returned exactly as the driver returned it.
 */
#include <string.h>

#include "log.h"
#include "shim_state.h"

struct hook {
    const char *name;
    int version;
    bool ptsz;
    void *hook;
    void **real; /* the slot in shim_real the hook calls */
};

#define H(name, version, fn) {name, version, false, (void *)(fn), (void **)&shim_real.fn}
#define P(name, version, fn) {name, version, true, (void *)(fn), (void **)&shim_real.fn}

SHIM_EXPORT CUresult cuGetProcAddress(const char *symbol, void **pfn, int cudaVersion,
                                      cuuint64_t flags);
SHIM_EXPORT CUresult cuGetProcAddress_v2(const char *symbol, void **pfn, int cudaVersion,
                                         cuuint64_t flags,
                                         CUdriverProcAddressQueryResult *symbolStatus);
SHIM_EXPORT CUresult cuGetProcAddress_v2_ptsz(const char *symbol, void **pfn, int cudaVersion,
                                              cuuint64_t flags,
                                              CUdriverProcAddressQueryResult *symbolStatus);

static const struct hook table[] = {
    H("cuInit", 2000, cuInit),
    H("cuGetProcAddress", 11030, cuGetProcAddress),
    H("cuGetProcAddress", 12000, cuGetProcAddress_v2),
    P("cuGetProcAddress", 12000, cuGetProcAddress_v2_ptsz),
    H("cuMemAlloc", 2000, cuMemAlloc),
    H("cuMemAlloc", 3020, cuMemAlloc_v2),
    H("cuMemAllocPitch", 2000, cuMemAllocPitch),
    H("cuMemAllocPitch", 3020, cuMemAllocPitch_v2),
    H("cuMemAllocManaged", 6000, cuMemAllocManaged),
    H("cuMemFree", 3020, cuMemFree_v2),
    H("cuMemGetInfo", 2000, cuMemGetInfo),
    H("cuMemGetInfo", 3020, cuMemGetInfo_v2),
    H("cuDeviceTotalMem", 2000, cuDeviceTotalMem),
    H("cuDeviceTotalMem", 3020, cuDeviceTotalMem_v2),
    H("cuMemAllocAsync", 11020, cuMemAllocAsync),
    P("cuMemAllocAsync", 11020, cuMemAllocAsync_ptsz),
    H("cuMemFreeAsync", 11020, cuMemFreeAsync),
    P("cuMemFreeAsync", 11020, cuMemFreeAsync_ptsz),
    H("cuMemAllocFromPoolAsync", 11020, cuMemAllocFromPoolAsync),
    P("cuMemAllocFromPoolAsync", 11020, cuMemAllocFromPoolAsync_ptsz),
    H("cuMemPoolCreate", 11020, cuMemPoolCreate),
    H("cuMemPoolDestroy", 11020, cuMemPoolDestroy),
    H("cuMemPoolTrimTo", 11020, cuMemPoolTrimTo),
    H("cuMemCreate", 10020, cuMemCreate),
    H("cuMemRelease", 10020, cuMemRelease),
    H("cuMemRetainAllocationHandle", 11000, cuMemRetainAllocationHandle),
    H("cuMemImportFromShareableHandle", 10020, cuMemImportFromShareableHandle),
    H("cuMemMap", 10020, cuMemMap),
    H("cuMemUnmap", 10020, cuMemUnmap),
    H("cuArrayCreate", 2000, cuArrayCreate),
    H("cuArrayCreate", 3020, cuArrayCreate_v2),
    H("cuArray3DCreate", 2000, cuArray3DCreate),
    H("cuArray3DCreate", 3020, cuArray3DCreate_v2),
    H("cuArrayDestroy", 2000, cuArrayDestroy),
    H("cuCtxDestroy", 4000, cuCtxDestroy_v2),
    H("cuDevicePrimaryCtxRetain", 7000, cuDevicePrimaryCtxRetain),
    H("cuDevicePrimaryCtxRelease", 7000, cuDevicePrimaryCtxRelease),
    H("cuDevicePrimaryCtxRelease", 11000, cuDevicePrimaryCtxRelease_v2),
    H("cuDevicePrimaryCtxReset", 7000, cuDevicePrimaryCtxReset),
    H("cuDevicePrimaryCtxReset", 11000, cuDevicePrimaryCtxReset_v2),
    H("cuLaunchKernel", 4000, cuLaunchKernel),
    P("cuLaunchKernel", 7000, cuLaunchKernel_ptsz),
    H("cuLaunchKernelEx", 11060, cuLaunchKernelEx),
    P("cuLaunchKernelEx", 11060, cuLaunchKernelEx_ptsz),
    H("cuLaunchCooperativeKernel", 9000, cuLaunchCooperativeKernel),
    P("cuLaunchCooperativeKernel", 9000, cuLaunchCooperativeKernel_ptsz),
    H("cuGraphLaunch", 10000, cuGraphLaunch),
    P("cuGraphLaunch", 10000, cuGraphLaunch_ptsz),
    H("cuStreamBeginCapture", 10000, cuStreamBeginCapture),
    P("cuStreamBeginCapture", 10000, cuStreamBeginCapture_ptsz),
    H("cuStreamBeginCapture", 10010, cuStreamBeginCapture_v2),
    P("cuStreamBeginCapture", 10010, cuStreamBeginCapture_v2_ptsz),
    H("cuStreamBeginCaptureToGraph", 12030, cuStreamBeginCaptureToGraph),
    P("cuStreamBeginCaptureToGraph", 12030, cuStreamBeginCaptureToGraph_ptsz),
    H("cuStreamBeginCaptureToCig", 13020, cuStreamBeginCaptureToCig),
    H("cuStreamBeginRecaptureToGraph", 13030, cuStreamBeginRecaptureToGraph),
    H("cuGraphInstantiate", 10000, cuGraphInstantiate_v2),
    H("cuGraphInstantiate", 12000, cuGraphInstantiateWithFlags),
    H("cuGraphInstantiateWithFlags", 11040, cuGraphInstantiateWithFlags),
    H("cuGraphInstantiateWithParams", 12000, cuGraphInstantiateWithParams),
    P("cuGraphInstantiateWithParams", 12000, cuGraphInstantiateWithParams_ptsz),
    H("cuGraphExecDestroy", 10000, cuGraphExecDestroy),
    H("cuDeviceGraphMemTrim", 11040, cuDeviceGraphMemTrim),
    H("cuMipmappedArrayCreate", 5000, cuMipmappedArrayCreate),
};

/* The hook for (symbol, version, flags), or NULL if the shim does not hook that ABI. */
static const struct hook *find_hook(const char *symbol, int version, bool want_ptsz)
{
    const struct hook *best = NULL;
    bool has_ptsz = false;
    for (size_t i = 0; i < sizeof table / sizeof table[0]; i++)
        if (table[i].ptsz && strcmp(table[i].name, symbol) == 0)
            has_ptsz = true;
    for (size_t i = 0; i < sizeof table / sizeof table[0]; i++) {
        const struct hook *h = &table[i];
        if (h->version > version || strcmp(h->name, symbol) != 0)
            continue;
        if (h->ptsz != (want_ptsz && has_ptsz))
            continue;
        if (best == NULL || h->version > best->version)
            best = h;
    }
    return best;
}

/* `per_thread_default`: the caller is the _ptsz getter, for which the default flag means the
 * per-thread default stream (cuda.h maps cuGetProcAddress to it under per-thread compilation). */
static void *substitute(const char *symbol, void *real_fn, int version, cuuint64_t flags,
                        bool per_thread_default)
{
    if (symbol == NULL || real_fn == NULL)
        return real_fn;
    bool ptsz = (flags & CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM) != 0 ||
                (per_thread_default && (flags & CU_GET_PROC_ADDRESS_LEGACY_STREAM) == 0);
    const struct hook *h = find_hook(symbol, version, ptsz);
    if (h == NULL)
        return real_fn;
    if (h->hook == real_fn)
        return real_fn;
    void *expected = NULL;
    __atomic_compare_exchange_n(h->real, &expected, real_fn, false, __ATOMIC_ACQ_REL,
                                __ATOMIC_ACQUIRE);
    SHIM_DEBUG("cuGetProcAddress(%s, %d, %llu): hooked", symbol, version,
               (unsigned long long)flags);
    return h->hook;
}

SHIM_EXPORT CUresult cuGetProcAddress(const char *symbol, void **pfn, int cudaVersion,
                                      cuuint64_t flags)
{
    shim_init();
    CUresult rc = shim_real.cuGetProcAddress(symbol, pfn, cudaVersion, flags);
    if (rc == CUDA_SUCCESS && pfn != NULL)
        *pfn = substitute(symbol, *pfn, cudaVersion, flags, false);
    return rc;
}

SHIM_EXPORT CUresult cuGetProcAddress_v2(const char *symbol, void **pfn, int cudaVersion,
                                         cuuint64_t flags,
                                         CUdriverProcAddressQueryResult *symbolStatus)
{
    shim_init();
    if (shim_real.cuGetProcAddress_v2 == NULL)
        return CUDA_ERROR_NOT_FOUND;
    CUresult rc = shim_real.cuGetProcAddress_v2(symbol, pfn, cudaVersion, flags, symbolStatus);
    if (rc == CUDA_SUCCESS && pfn != NULL)
        *pfn = substitute(symbol, *pfn, cudaVersion, flags, false);
    return rc;
}

SHIM_EXPORT CUresult cuGetProcAddress_v2_ptsz(const char *symbol, void **pfn, int cudaVersion,
                                              cuuint64_t flags,
                                              CUdriverProcAddressQueryResult *symbolStatus)
{
    shim_init();
    if (shim_real.cuGetProcAddress_v2_ptsz == NULL)
        return CUDA_ERROR_NOT_FOUND;
    CUresult rc =
        shim_real.cuGetProcAddress_v2_ptsz(symbol, pfn, cudaVersion, flags, symbolStatus);
    if (rc == CUDA_SUCCESS && pfn != NULL)
        *pfn = substitute(symbol, *pfn, cudaVersion, flags, true);
    return rc;
}

SHIM_EXPORT CUresult cuInit(unsigned int flags)
{
    shim_init();
    CUresult rc = shim_real.cuInit(flags);
    if (rc == CUDA_SUCCESS)
        shim_devices_ready();
    return rc;
}
