/*
 * Conformance of the CUDA driver API subset the shim and its tests rely on: results and error
 * codes of each call, success and failure paths. Exit status 0 and "PASS" when every check
 * holds; each failed check is reported on stderr. Runs unchanged against a real GPU's libcuda.
 */
#include <pthread.h>
#include <stdbool.h>
#include <unistd.h>

#include "simgpu_test.h"

static void *lib;

static void before_init(void)
{
    LOAD(lib, cuDeviceGetCount);
    LOAD(lib, cuGetErrorName);
    LOAD(lib, cuGetErrorString);
    LOAD(lib, cuDriverGetVersion);
    LOAD(lib, cuInit);
    int n = 0;
    const char *s = NULL;
    EXPECT_EQ(p_cuDeviceGetCount(&n), CUDA_ERROR_NOT_INITIALIZED);
    EXPECT_EQ(p_cuGetErrorName(CUDA_ERROR_OUT_OF_MEMORY, &s), CUDA_SUCCESS);
    EXPECT_TRUE(s != NULL && strcmp(s, "CUDA_ERROR_OUT_OF_MEMORY") == 0);
    EXPECT_EQ(p_cuGetErrorString(CUDA_ERROR_INVALID_VALUE, &s), CUDA_SUCCESS);
    EXPECT_TRUE(s != NULL && strcmp(s, "invalid argument") == 0);
    EXPECT_EQ(p_cuGetErrorName((CUresult)12345, &s), CUDA_ERROR_INVALID_VALUE);
    EXPECT_EQ(p_cuDriverGetVersion(&n), CUDA_SUCCESS);
    EXPECT_TRUE(n >= 11000);
    EXPECT_EQ(p_cuInit(1), CUDA_ERROR_INVALID_VALUE);
    EXPECT_EQ(p_cuInit(0), CUDA_SUCCESS);
    EXPECT_EQ(p_cuInit(0), CUDA_SUCCESS);
}

static void devices(void)
{
    LOAD(lib, cuDeviceGetCount);
    LOAD(lib, cuDeviceGet);
    LOAD(lib, cuDeviceGetName);
    LOAD(lib, cuDeviceGetUuid);
    LOAD(lib, cuDeviceTotalMem_v2);
    LOAD(lib, cuDeviceGetAttribute);
    LOAD(lib, cuDeviceGetPCIBusId);
    LOAD(lib, cuDeviceGetByPCIBusId);
    int n = 0, v = 0;
    CUdevice d = -1;
    char name[128], bus[32];
    size_t total = 0;
    CUuuid uuid;
    EXPECT_EQ(p_cuDeviceGetCount(&n), CUDA_SUCCESS);
    EXPECT_TRUE(n >= 1);
    EXPECT_EQ(p_cuDeviceGet(&d, n), CUDA_ERROR_INVALID_DEVICE);
    EXPECT_EQ(p_cuDeviceGet(NULL, 0), CUDA_ERROR_INVALID_VALUE);
    EXPECT_EQ(p_cuDeviceGet(&d, 0), CUDA_SUCCESS);
    EXPECT_EQ(p_cuDeviceGetName(name, sizeof name, d), CUDA_SUCCESS);
    EXPECT_TRUE(strlen(name) > 0);
    EXPECT_EQ(p_cuDeviceGetName(name, sizeof name, 99), CUDA_ERROR_INVALID_DEVICE);
    EXPECT_EQ(p_cuDeviceGetUuid(&uuid, d), CUDA_SUCCESS);
    EXPECT_EQ(p_cuDeviceTotalMem_v2(&total, d), CUDA_SUCCESS);
    EXPECT_TRUE(total > 0);
    EXPECT_EQ(p_cuDeviceGetAttribute(&v, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, d),
              CUDA_SUCCESS);
    EXPECT_TRUE(v >= 3);
    EXPECT_EQ(p_cuDeviceGetAttribute(&v, CU_DEVICE_ATTRIBUTE_WARP_SIZE, d), CUDA_SUCCESS);
    EXPECT_EQ(v, 32);
    EXPECT_EQ(p_cuDeviceGetAttribute(&v, (CUdevice_attribute)0, d), CUDA_ERROR_INVALID_VALUE);
    EXPECT_EQ(p_cuDeviceGetPCIBusId(bus, sizeof bus, d), CUDA_SUCCESS);
    CUdevice again = -1;
    EXPECT_EQ(p_cuDeviceGetByPCIBusId(&again, bus), CUDA_SUCCESS);
    EXPECT_EQ(again, d);
    EXPECT_EQ(p_cuDeviceGetByPCIBusId(&again, "not-a-bus-id"), CUDA_ERROR_INVALID_VALUE);
    printf("device 0: %s, %zu bytes, %s\n", name, total, bus);
}

static void contexts(void)
{
    LOAD(lib, cuCtxGetCurrent);
    LOAD(lib, cuCtxSetCurrent);
    LOAD(lib, cuCtxCreate_v2);
    LOAD(lib, cuCtxDestroy_v2);
    LOAD(lib, cuCtxPushCurrent_v2);
    LOAD(lib, cuCtxPopCurrent_v2);
    LOAD(lib, cuCtxGetDevice);
    LOAD(lib, cuCtxSynchronize);
    LOAD(lib, cuMemAlloc_v2);
    LOAD(lib, cuDevicePrimaryCtxRetain);
    LOAD(lib, cuDevicePrimaryCtxRelease_v2);
    LOAD(lib, cuDevicePrimaryCtxGetState);
    CUcontext cur = (CUcontext)1, primary = NULL, mine = NULL, popped = NULL;
    CUdeviceptr p = 0;
    CUdevice dev = -1;
    unsigned int flags = 0;
    int active = -1;
    EXPECT_EQ(p_cuCtxGetCurrent(&cur), CUDA_SUCCESS);
    EXPECT_TRUE(cur == NULL);
    EXPECT_EQ(p_cuMemAlloc_v2(&p, 1024), CUDA_ERROR_INVALID_CONTEXT);
    EXPECT_EQ(p_cuCtxSynchronize(), CUDA_ERROR_INVALID_CONTEXT);
    EXPECT_EQ(p_cuCtxPopCurrent_v2(&popped), CUDA_ERROR_INVALID_CONTEXT);
    EXPECT_EQ(p_cuDevicePrimaryCtxGetState(0, &flags, &active), CUDA_SUCCESS);
    EXPECT_EQ(active, 0);
    EXPECT_EQ(p_cuDevicePrimaryCtxRetain(&primary, 0), CUDA_SUCCESS);
    EXPECT_EQ(p_cuDevicePrimaryCtxGetState(0, &flags, &active), CUDA_SUCCESS);
    EXPECT_EQ(active, 1);
    EXPECT_EQ(p_cuCtxDestroy_v2(primary), CUDA_ERROR_INVALID_CONTEXT);
    EXPECT_EQ(p_cuCtxCreate_v2(&mine, 0, 0), CUDA_SUCCESS);
    EXPECT_EQ(p_cuCtxGetCurrent(&cur), CUDA_SUCCESS);
    EXPECT_TRUE(cur == mine);
    EXPECT_EQ(p_cuCtxPushCurrent_v2(primary), CUDA_SUCCESS);
    EXPECT_EQ(p_cuCtxGetCurrent(&cur), CUDA_SUCCESS);
    EXPECT_TRUE(cur == primary);
    EXPECT_EQ(p_cuCtxPopCurrent_v2(&popped), CUDA_SUCCESS);
    EXPECT_TRUE(popped == primary);
    EXPECT_EQ(p_cuCtxGetDevice(&dev), CUDA_SUCCESS);
    EXPECT_EQ(dev, 0);
    EXPECT_EQ(p_cuCtxDestroy_v2(mine), CUDA_SUCCESS);
    EXPECT_EQ(p_cuCtxDestroy_v2(mine), CUDA_ERROR_INVALID_CONTEXT);
    EXPECT_EQ(p_cuCtxCreate_v2(&mine, 0x1000, 0), CUDA_ERROR_INVALID_VALUE);
    EXPECT_EQ(p_cuCtxSetCurrent(primary), CUDA_SUCCESS);
    /* The primary context stays retained for the rest of the program. */
    EXPECT_EQ(p_cuDevicePrimaryCtxRelease_v2(5000), CUDA_ERROR_INVALID_DEVICE);
}

static void memory(void)
{
    LOAD(lib, cuMemAlloc_v2);
    LOAD(lib, cuMemFree_v2);
    LOAD(lib, cuMemGetInfo_v2);
    LOAD(lib, cuMemcpyHtoD_v2);
    LOAD(lib, cuMemcpyDtoH_v2);
    LOAD(lib, cuMemcpyDtoD_v2);
    LOAD(lib, cuMemsetD32_v2);
    LOAD(lib, cuMemGetAddressRange_v2);
    LOAD(lib, cuMemAllocPitch_v2);
    LOAD(lib, cuMemAllocManaged);
    LOAD(lib, cuMemAllocHost_v2);
    LOAD(lib, cuMemFreeHost);
    LOAD(lib, cuDeviceTotalMem_v2);
    size_t free0 = 0, free1 = 0, total = 0, size = 0, pitch = 0;
    CUdeviceptr a = 0, b = 0, base = 0;
    const size_t n = 1 << 20;
    uint32_t *host = malloc(n), *back = malloc(n);
    for (size_t i = 0; i < n / 4; i++)
        host[i] = (uint32_t)i * 2654435761u;
    EXPECT_EQ(p_cuMemAlloc_v2(&a, 0), CUDA_ERROR_INVALID_VALUE);
    EXPECT_EQ(p_cuMemGetInfo_v2(&free0, &total), CUDA_SUCCESS);
    EXPECT_EQ(p_cuMemAlloc_v2(&a, n), CUDA_SUCCESS);
    EXPECT_EQ(p_cuMemAlloc_v2(&b, n), CUDA_SUCCESS);
    EXPECT_EQ(p_cuMemGetInfo_v2(&free1, &total), CUDA_SUCCESS);
    EXPECT_TRUE(free0 - free1 >= 2 * n);
    EXPECT_EQ(p_cuMemsetD32_v2(a, 0xdeadbeef, n / 4), CUDA_SUCCESS);
    EXPECT_EQ(p_cuMemcpyDtoH_v2(back, a, n), CUDA_SUCCESS);
    EXPECT_EQ(back[n / 4 - 1], 0xdeadbeef);
    EXPECT_EQ(p_cuMemcpyHtoD_v2(a, host, n), CUDA_SUCCESS);
    EXPECT_EQ(p_cuMemcpyDtoD_v2(b, a, n), CUDA_SUCCESS);
    EXPECT_EQ(p_cuMemcpyDtoH_v2(back, b, n), CUDA_SUCCESS);
    EXPECT_EQ(memcmp(host, back, n), 0);
    EXPECT_EQ(p_cuMemGetAddressRange_v2(&base, &size, a + 100), CUDA_SUCCESS);
    EXPECT_TRUE(base == a && size >= n);
    EXPECT_EQ(p_cuMemFree_v2(a), CUDA_SUCCESS);
    EXPECT_EQ(p_cuMemFree_v2(a), CUDA_ERROR_INVALID_VALUE);
    EXPECT_EQ(p_cuMemFree_v2(b), CUDA_SUCCESS);
    EXPECT_EQ(p_cuDeviceTotalMem_v2(&total, 0), CUDA_SUCCESS);
    EXPECT_EQ(p_cuMemAlloc_v2(&a, total + (1ULL << 30)), CUDA_ERROR_OUT_OF_MEMORY);
    EXPECT_EQ(p_cuMemAllocPitch_v2(&a, &pitch, 1000, 10, 4), CUDA_SUCCESS);
    EXPECT_TRUE(pitch >= 1000);
    EXPECT_EQ(p_cuMemFree_v2(a), CUDA_SUCCESS);
    EXPECT_EQ(p_cuMemAllocPitch_v2(&a, &pitch, 1000, 10, 3), CUDA_ERROR_INVALID_VALUE);
    EXPECT_EQ(p_cuMemAllocManaged(&a, 4096, CU_MEM_ATTACH_GLOBAL), CUDA_SUCCESS);
    ((volatile char *)a)[10] = 42; /* managed memory is host-accessible */
    EXPECT_EQ(((volatile char *)a)[10], 42);
    EXPECT_EQ(p_cuMemFree_v2(a), CUDA_SUCCESS);
    EXPECT_EQ(p_cuMemAllocManaged(&a, 4096, 0x40), CUDA_ERROR_INVALID_VALUE);
    void *pinned = NULL;
    EXPECT_EQ(p_cuMemAllocHost_v2(&pinned, 4096), CUDA_SUCCESS);
    EXPECT_EQ(p_cuMemFreeHost(pinned), CUDA_SUCCESS);
    free(host);
    free(back);
}

static void pools_and_async(void)
{
    LOAD(lib, cuStreamCreate);
    LOAD(lib, cuStreamDestroy_v2);
    LOAD(lib, cuStreamSynchronize);
    LOAD(lib, cuMemAllocAsync);
    LOAD(lib, cuMemFreeAsync);
    LOAD(lib, cuMemPoolCreate);
    LOAD(lib, cuMemPoolDestroy);
    LOAD(lib, cuMemAllocFromPoolAsync);
    LOAD(lib, cuMemPoolGetAttribute);
    LOAD(lib, cuMemPoolTrimTo);
    LOAD(lib, cuDeviceGetDefaultMemPool);
    LOAD(lib, cuMemGetInfo_v2);
    CUstream s = NULL;
    CUdeviceptr p = 0, q = 0;
    CUmemoryPool pool = NULL, dflt = NULL;
    cuuint64_t used = 1;
    CUmemPoolProps props;
    memset(&props, 0, sizeof props);
    props.allocType = CU_MEM_ALLOCATION_TYPE_PINNED;
    props.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    props.location.id = 0;
    EXPECT_EQ(p_cuStreamCreate(&s, CU_STREAM_NON_BLOCKING), CUDA_SUCCESS);
    EXPECT_EQ(p_cuDeviceGetDefaultMemPool(&dflt, 0), CUDA_SUCCESS);
    EXPECT_EQ(p_cuMemAllocAsync(&p, 1 << 20, s), CUDA_SUCCESS);
    EXPECT_EQ(p_cuMemFreeAsync(p, s), CUDA_SUCCESS);
    EXPECT_EQ(p_cuMemPoolCreate(&pool, &props), CUDA_SUCCESS);
    EXPECT_EQ(p_cuMemAllocFromPoolAsync(&q, 3 << 20, pool, s), CUDA_SUCCESS);
    EXPECT_EQ(p_cuMemPoolGetAttribute(pool, CU_MEMPOOL_ATTR_USED_MEM_CURRENT, &used),
              CUDA_SUCCESS);
    EXPECT_TRUE(used >= (3 << 20));
    EXPECT_EQ(p_cuMemFreeAsync(q, s), CUDA_SUCCESS);
    EXPECT_EQ(p_cuStreamSynchronize(s), CUDA_SUCCESS);
    EXPECT_EQ(p_cuMemPoolTrimTo(pool, 0), CUDA_SUCCESS);
    EXPECT_EQ(p_cuMemPoolGetAttribute(pool, CU_MEMPOOL_ATTR_USED_MEM_CURRENT, &used),
              CUDA_SUCCESS);
    EXPECT_EQ(used, 0);
    /* More than the device has: the pool cannot grow, and its reservation is unchanged. */
    size_t free0 = 0, free1 = 0, total = 0;
    cuuint64_t reserved = 1;
    EXPECT_EQ(p_cuMemGetInfo_v2(&free0, &total), CUDA_SUCCESS);
    EXPECT_EQ(p_cuMemAllocFromPoolAsync(&q, total + (1 << 20), pool, s),
              CUDA_ERROR_OUT_OF_MEMORY);
    EXPECT_EQ(p_cuMemPoolGetAttribute(pool, CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT, &reserved),
              CUDA_SUCCESS);
    EXPECT_EQ(reserved, 0);
    /* A pool destroyed with an allocation outstanding keeps its whole 2 MiB chunk until that
     * is freed, then gives it back. (Under a memory-limited shim cuMemGetInfo shows the claim's
     * charge, which counts the destroyed pool's reservation the same way.) */
    EXPECT_EQ(p_cuMemAllocFromPoolAsync(&q, 1 << 20, pool, s), CUDA_SUCCESS);
    EXPECT_EQ(p_cuMemPoolDestroy(pool), CUDA_SUCCESS);
    EXPECT_EQ(p_cuMemGetInfo_v2(&free1, &total), CUDA_SUCCESS);
    EXPECT_EQ(free0 - free1, 2 << 20);
    EXPECT_EQ(p_cuMemFreeAsync(q, s), CUDA_SUCCESS);
    EXPECT_EQ(p_cuMemGetInfo_v2(&free1, &total), CUDA_SUCCESS);
    EXPECT_EQ(free1, free0);
    EXPECT_EQ(p_cuMemAllocFromPoolAsync(&q, 1 << 20, NULL, s), CUDA_ERROR_INVALID_VALUE);
    props.allocType = CU_MEM_ALLOCATION_TYPE_INVALID;
    EXPECT_EQ(p_cuMemPoolCreate(&pool, &props), CUDA_ERROR_INVALID_VALUE);
    EXPECT_EQ(p_cuStreamDestroy_v2(s), CUDA_SUCCESS);
}

/* A pool reserves device memory in chunks (an allocation that fits in no chunk's free space
 * grows the reservation by its size rounded up to 2 MiB) and keeps freed memory reserved
 * (RESERVED_MEM_CURRENT, and used on the device) until a synchronisation trims it to its release
 * threshold, or cuMemPoolTrimTo; both count the pool's allocations towards what they keep and
 * release only whole chunks nothing is allocated from; a block of the same size is reused from
 * the cache. */
static void pool_cache(void)
{
    LOAD(lib, cuStreamCreate);
    LOAD(lib, cuStreamDestroy_v2);
    LOAD(lib, cuStreamSynchronize);
    LOAD(lib, cuMemAllocAsync);
    LOAD(lib, cuMemFreeAsync);
    LOAD(lib, cuMemGetInfo_v2);
    LOAD(lib, cuMemPoolGetAttribute);
    LOAD(lib, cuMemPoolSetAttribute);
    LOAD(lib, cuMemPoolTrimTo);
    LOAD(lib, cuDeviceGetMemPool);
    const cuuint64_t mib = 1 << 20;
    CUstream s = NULL;
    CUmemoryPool pool = NULL;
    CUdeviceptr a = 0, b = 0, c = 0, d = 0, e = 0, f = 0;
    cuuint64_t reserved = 0, used = 0, high = 0, threshold = 4 * mib;
    size_t free0 = 0, free1 = 0, total = 0;
    EXPECT_EQ(p_cuStreamCreate(&s, CU_STREAM_NON_BLOCKING), CUDA_SUCCESS);
    EXPECT_EQ(p_cuDeviceGetMemPool(&pool, 0), CUDA_SUCCESS);
    EXPECT_EQ(p_cuMemPoolSetAttribute(pool, CU_MEMPOOL_ATTR_RELEASE_THRESHOLD, &threshold),
              CUDA_SUCCESS);
    EXPECT_EQ(p_cuMemGetInfo_v2(&free0, &total), CUDA_SUCCESS);
    EXPECT_EQ(p_cuMemAllocAsync(&a, 2 * mib, s), CUDA_SUCCESS); /* chunk A: 2 MiB */
    EXPECT_EQ(p_cuMemAllocAsync(&b, 2 * mib, s), CUDA_SUCCESS); /* chunk B: 2 MiB */
    EXPECT_EQ(p_cuMemAllocAsync(&c, 1 * mib, s), CUDA_SUCCESS); /* chunk C: 2 MiB, 1 MiB free */
    EXPECT_EQ(p_cuMemFreeAsync(a, s), CUDA_SUCCESS);
    EXPECT_EQ(p_cuMemPoolGetAttribute(pool, CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT, &reserved),
              CUDA_SUCCESS);
    EXPECT_EQ(p_cuMemPoolGetAttribute(pool, CU_MEMPOOL_ATTR_USED_MEM_CURRENT, &used),
              CUDA_SUCCESS);
    EXPECT_EQ(reserved, 6 * mib); /* whole chunks, the freed block's included */
    EXPECT_EQ(used, 3 * mib);
    EXPECT_EQ(p_cuMemGetInfo_v2(&free1, &total), CUDA_SUCCESS);
    EXPECT_EQ(free0 - free1, 6 * mib); /* and taken on the device */
    /* Half a MiB fits in chunk C's free space: no growth. */
    EXPECT_EQ(p_cuMemAllocAsync(&d, mib / 2, s), CUDA_SUCCESS);
    EXPECT_EQ(p_cuMemAllocAsync(&a, 2 * mib, s), CUDA_SUCCESS); /* reused from the cache */
    EXPECT_EQ(p_cuMemPoolGetAttribute(pool, CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT, &reserved),
              CUDA_SUCCESS);
    EXPECT_EQ(reserved, 6 * mib);
    /* 1 MiB fits in chunk C once the cached half MiB there is dropped: still no growth. */
    EXPECT_EQ(p_cuMemFreeAsync(d, s), CUDA_SUCCESS);
    EXPECT_EQ(p_cuMemAllocAsync(&e, 1 * mib, s), CUDA_SUCCESS);
    EXPECT_EQ(p_cuMemPoolGetAttribute(pool, CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT, &reserved),
              CUDA_SUCCESS);
    EXPECT_EQ(reserved, 6 * mib);
    /* 3 MiB fits nowhere: the pool grows by 4 MiB (chunk F). */
    EXPECT_EQ(p_cuMemAllocAsync(&f, 3 * mib, s), CUDA_SUCCESS);
    EXPECT_EQ(p_cuMemPoolGetAttribute(pool, CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT, &reserved),
              CUDA_SUCCESS);
    EXPECT_EQ(reserved, 10 * mib);
    EXPECT_EQ(p_cuMemGetInfo_v2(&free1, &total), CUDA_SUCCESS);
    EXPECT_EQ(free0 - free1, 10 * mib);
    EXPECT_EQ(p_cuMemFreeAsync(e, s), CUDA_SUCCESS);
    EXPECT_EQ(p_cuMemFreeAsync(f, s), CUDA_SUCCESS);
    EXPECT_EQ(p_cuMemFreeAsync(a, s), CUDA_SUCCESS);
    EXPECT_EQ(p_cuMemFreeAsync(b, s), CUDA_SUCCESS);
    /* A sync trims the reservation to the threshold (4 MiB, chunk C in use included), newest
     * unused chunk first: F and B go, A stays. */
    EXPECT_EQ(p_cuStreamSynchronize(s), CUDA_SUCCESS);
    EXPECT_EQ(p_cuMemPoolGetAttribute(pool, CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT, &reserved),
              CUDA_SUCCESS);
    EXPECT_EQ(reserved, 4 * mib);
    EXPECT_EQ(p_cuMemGetInfo_v2(&free1, &total), CUDA_SUCCESS);
    EXPECT_EQ(free0 - free1, 4 * mib);
    EXPECT_EQ(p_cuMemPoolGetAttribute(pool, CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH, &high),
              CUDA_SUCCESS);
    EXPECT_EQ(high, 10 * mib);
    /* TrimTo(0) releases every unused chunk, never one in use. */
    EXPECT_EQ(p_cuMemPoolTrimTo(pool, 0), CUDA_SUCCESS);
    EXPECT_EQ(p_cuMemPoolGetAttribute(pool, CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT, &reserved),
              CUDA_SUCCESS);
    EXPECT_EQ(reserved, 2 * mib);
    EXPECT_EQ(p_cuMemFreeAsync(c, s), CUDA_SUCCESS);
    threshold = 0;
    EXPECT_EQ(p_cuMemPoolSetAttribute(pool, CU_MEMPOOL_ATTR_RELEASE_THRESHOLD, &threshold),
              CUDA_SUCCESS);
    EXPECT_EQ(p_cuStreamSynchronize(s), CUDA_SUCCESS);
    EXPECT_EQ(p_cuMemPoolGetAttribute(pool, CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT, &reserved),
              CUDA_SUCCESS);
    EXPECT_EQ(reserved, 0);
    EXPECT_EQ(p_cuMemGetInfo_v2(&free1, &total), CUDA_SUCCESS);
    EXPECT_EQ(free1, free0);
    /* cuMemFree of a stream-ordered allocation (CUDA allows it) gives it back to its pool: no
     * longer used, cached until trimmed; a second free is refused. */
    LOAD(lib, cuMemFree_v2);
    EXPECT_EQ(p_cuMemAllocAsync(&a, 2 * mib, s), CUDA_SUCCESS);
    EXPECT_EQ(p_cuStreamSynchronize(s), CUDA_SUCCESS);
    EXPECT_EQ(p_cuMemFree_v2(a), CUDA_SUCCESS);
    EXPECT_EQ(p_cuMemFree_v2(a), CUDA_ERROR_INVALID_VALUE);
    EXPECT_EQ(p_cuMemPoolGetAttribute(pool, CU_MEMPOOL_ATTR_USED_MEM_CURRENT, &used),
              CUDA_SUCCESS);
    EXPECT_EQ(used, 0);
    EXPECT_EQ(p_cuMemPoolTrimTo(pool, 0), CUDA_SUCCESS);
    EXPECT_EQ(p_cuMemPoolGetAttribute(pool, CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT, &reserved),
              CUDA_SUCCESS);
    EXPECT_EQ(reserved, 0);
    EXPECT_EQ(p_cuMemGetInfo_v2(&free1, &total), CUDA_SUCCESS);
    EXPECT_EQ(free1, free0);
    EXPECT_EQ(p_cuStreamDestroy_v2(s), CUDA_SUCCESS);
}

static void vmm(void)
{
    LOAD(lib, cuMemGetAllocationGranularity);
    LOAD(lib, cuMemCreate);
    LOAD(lib, cuMemRelease);
    LOAD(lib, cuMemAddressReserve);
    LOAD(lib, cuMemAddressFree);
    LOAD(lib, cuMemMap);
    LOAD(lib, cuMemUnmap);
    LOAD(lib, cuMemSetAccess);
    LOAD(lib, cuMemsetD8_v2);
    LOAD(lib, cuMemcpyDtoH_v2);
    CUmemAllocationProp prop;
    memset(&prop, 0, sizeof prop);
    prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    prop.location.id = 0;
    size_t gran = 0;
    CUmemGenericAllocationHandle h = 0;
    CUdeviceptr va = 0;
    EXPECT_EQ(p_cuMemGetAllocationGranularity(&gran, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM),
              CUDA_SUCCESS);
    EXPECT_TRUE(gran > 0);
    EXPECT_EQ(p_cuMemCreate(&h, gran + 1, &prop, 0), CUDA_ERROR_INVALID_VALUE);
    EXPECT_EQ(p_cuMemCreate(&h, 2 * gran, &prop, 0), CUDA_SUCCESS);
    EXPECT_EQ(p_cuMemAddressReserve(&va, 4 * gran, 0, 0, 0), CUDA_SUCCESS);
    EXPECT_EQ(p_cuMemMap(va, 2 * gran, 0, h, 0), CUDA_SUCCESS);
    EXPECT_EQ(p_cuMemMap(va, 2 * gran, 0, h, 0), CUDA_ERROR_INVALID_VALUE);
    CUmemAccessDesc access = {{CU_MEM_LOCATION_TYPE_DEVICE, 0}, CU_MEM_ACCESS_FLAGS_PROT_READWRITE};
    EXPECT_EQ(p_cuMemSetAccess(va, 2 * gran, &access, 1), CUDA_SUCCESS);
    EXPECT_EQ(p_cuMemSetAccess(va, 4 * gran, &access, 1), CUDA_ERROR_INVALID_VALUE);
    unsigned char byte = 0;
    EXPECT_EQ(p_cuMemsetD8_v2(va, 7, 2 * gran), CUDA_SUCCESS);
    EXPECT_EQ(p_cuMemcpyDtoH_v2(&byte, va + gran, 1), CUDA_SUCCESS);
    EXPECT_EQ(byte, 7);
    EXPECT_EQ(p_cuMemRelease(h), CUDA_SUCCESS); /* still mapped: memory lives on */
    EXPECT_EQ(p_cuMemRelease(h), CUDA_ERROR_INVALID_VALUE);
    EXPECT_EQ(p_cuMemUnmap(va, gran), CUDA_ERROR_INVALID_VALUE);
    EXPECT_EQ(p_cuMemUnmap(va, 2 * gran), CUDA_SUCCESS);
    EXPECT_EQ(p_cuMemAddressFree(va, 4 * gran), CUDA_SUCCESS);
}

static void arrays(void)
{
    LOAD(lib, cuArrayCreate_v2);
    LOAD(lib, cuArray3DCreate_v2);
    LOAD(lib, cuArrayGetDescriptor_v2);
    LOAD(lib, cuArrayDestroy);
    LOAD(lib, cuCtxCreate_v2);
    LOAD(lib, cuCtxDestroy_v2);
    LOAD(lib, cuMemGetInfo_v2);
    CUDA_ARRAY_DESCRIPTOR d = {256, 256, CU_AD_FORMAT_FLOAT, 4}, out;
    CUarray a = NULL;
    EXPECT_EQ(p_cuArrayCreate_v2(&a, &d), CUDA_SUCCESS);
    EXPECT_EQ(p_cuArrayGetDescriptor_v2(&out, a), CUDA_SUCCESS);
    EXPECT_TRUE(out.Width == 256 && out.NumChannels == 4 && out.Format == CU_AD_FORMAT_FLOAT);
    EXPECT_EQ(p_cuArrayDestroy(a), CUDA_SUCCESS);
    d.NumChannels = 3;
    EXPECT_EQ(p_cuArrayCreate_v2(&a, &d), CUDA_ERROR_INVALID_VALUE);

    /* Arrays die with their context, like every allocation: 2 x 64 MiB made in a context that
     * is then destroyed without cuArrayDestroy are free again. The slack allows for the
     * context's own memory on a real GPU. */
    const size_t mib = 1 << 20, slack = 32 * mib;
    size_t free0 = 0, free1 = 0, free2 = 0, total = 0;
    CUcontext ctx = NULL;
    CUarray a2 = NULL, a3 = NULL;
    CUDA_ARRAY_DESCRIPTOR d2 = {2048, 2048, CU_AD_FORMAT_FLOAT, 4};         /* 64 MiB */
    CUDA_ARRAY3D_DESCRIPTOR d3 = {256, 256, 64, CU_AD_FORMAT_FLOAT, 4, 0}; /* 64 MiB */
    EXPECT_EQ(p_cuMemGetInfo_v2(&free0, &total), CUDA_SUCCESS);
    EXPECT_EQ(p_cuCtxCreate_v2(&ctx, 0, 0), CUDA_SUCCESS);
    EXPECT_EQ(p_cuArrayCreate_v2(&a2, &d2), CUDA_SUCCESS);
    EXPECT_EQ(p_cuArray3DCreate_v2(&a3, &d3), CUDA_SUCCESS);
    EXPECT_EQ(p_cuMemGetInfo_v2(&free1, &total), CUDA_SUCCESS);
    EXPECT_TRUE(free0 - free1 >= 128 * mib);
    EXPECT_EQ(p_cuCtxDestroy_v2(ctx), CUDA_SUCCESS); /* the previous context is current again */
    EXPECT_EQ(p_cuMemGetInfo_v2(&free2, &total), CUDA_SUCCESS);
    EXPECT_TRUE(free2 + slack >= free0);
}

static void execution(void)
{
    LOAD(lib, cuModuleLoadData);
    LOAD(lib, cuModuleGetFunction);
    LOAD(lib, cuModuleUnload);
    LOAD(lib, cuLaunchKernel);
    LOAD(lib, cuLaunchKernelEx);
    LOAD(lib, cuLaunchCooperativeKernel);
    LOAD(lib, cuStreamCreate);
    LOAD(lib, cuStreamQuery);
    LOAD(lib, cuStreamIsCapturing);
    LOAD(lib, cuStreamIsCapturing_ptsz);
    LOAD(lib, cuStreamSynchronize);
    LOAD(lib, cuStreamDestroy_v2);
    LOAD(lib, cuEventCreate);
    LOAD(lib, cuEventRecord);
    LOAD(lib, cuEventQuery);
    LOAD(lib, cuEventSynchronize);
    LOAD(lib, cuEventElapsedTime);
    LOAD(lib, cuEventDestroy_v2);
    LOAD(lib, cuGraphCreate);
    LOAD(lib, cuGraphAddKernelNode_v2);
    LOAD(lib, cuGraphInstantiateWithFlags);
    LOAD(lib, cuGraphLaunch);
    LOAD(lib, cuGraphExecDestroy);
    LOAD(lib, cuGraphDestroy);
    CUmodule m = NULL;
    CUfunction f = NULL;
    CUstream s = NULL;
    CUevent start = NULL, end = NULL, untimed = NULL;
    uint64_t ns = 20 * 1000000ULL;
    void *params[] = {&ns};
    float ms = 0;
    EXPECT_EQ(p_cuModuleLoadData(&m, NULL), CUDA_ERROR_INVALID_VALUE);
    EXPECT_EQ(p_cuModuleLoadData(&m, sleep_kernel_ptx), CUDA_SUCCESS);
    EXPECT_EQ(p_cuModuleGetFunction(&f, m, "simgpu_sleep_ns"), CUDA_SUCCESS);
    EXPECT_EQ(p_cuStreamCreate(&s, 0), CUDA_SUCCESS);
    /* An ordinary stream, the legacy and the per-thread default stream are not capturing. */
    CUstreamCaptureStatus capture = CU_STREAM_CAPTURE_STATUS_INVALIDATED;
    EXPECT_EQ(p_cuStreamIsCapturing(s, &capture), CUDA_SUCCESS);
    EXPECT_EQ(capture, CU_STREAM_CAPTURE_STATUS_NONE);
    capture = CU_STREAM_CAPTURE_STATUS_INVALIDATED;
    EXPECT_EQ(p_cuStreamIsCapturing(NULL, &capture), CUDA_SUCCESS);
    EXPECT_EQ(capture, CU_STREAM_CAPTURE_STATUS_NONE);
    capture = CU_STREAM_CAPTURE_STATUS_INVALIDATED;
    EXPECT_EQ(p_cuStreamIsCapturing_ptsz(NULL, &capture), CUDA_SUCCESS);
    EXPECT_EQ(capture, CU_STREAM_CAPTURE_STATUS_NONE);
    EXPECT_EQ(p_cuEventCreate(&start, CU_EVENT_DEFAULT), CUDA_SUCCESS);
    EXPECT_EQ(p_cuEventCreate(&end, CU_EVENT_DEFAULT), CUDA_SUCCESS);
    EXPECT_EQ(p_cuEventCreate(&untimed, CU_EVENT_DISABLE_TIMING), CUDA_SUCCESS);
    /* A 20 ms kernel between two events. It cannot end before 20 ms after t0, read before it
     * was queued, so the stream, its end event and the elapsed time must be NOT_READY for
     * queries answered before then. A thread descheduled past that point (a busy machine)
     * cannot tell; the kernel is run again, up to 5 times, for a conclusive try. */
    uint64_t t0 = 0, answered = 0;
    CUresult stream_busy = CUDA_SUCCESS, end_busy = CUDA_SUCCESS, elapsed_busy = CUDA_SUCCESS;
    for (int attempt = 0; attempt < 5; attempt++) {
        t0 = test_now_ns();
        EXPECT_EQ(p_cuEventRecord(start, s), CUDA_SUCCESS);
        EXPECT_EQ(p_cuLaunchKernel(f, 1, 1, 1, 1, 1, 1, 0, s, params, NULL), CUDA_SUCCESS);
        EXPECT_EQ(p_cuEventRecord(end, s), CUDA_SUCCESS);
        stream_busy = p_cuStreamQuery(s);
        end_busy = p_cuEventQuery(end);
        elapsed_busy = p_cuEventElapsedTime(&ms, start, end);
        answered = test_now_ns();
        if (answered - t0 < ns)
            break;
        EXPECT_EQ(p_cuEventSynchronize(end), CUDA_SUCCESS);
    }
    if (answered - t0 < ns) {
        EXPECT_EQ(stream_busy, CUDA_ERROR_NOT_READY);
        EXPECT_EQ(end_busy, CUDA_ERROR_NOT_READY);
        EXPECT_EQ(elapsed_busy, CUDA_ERROR_NOT_READY);
    } else {
        test_unchecked += 3;
    }
    EXPECT_EQ(p_cuEventSynchronize(end), CUDA_SUCCESS);
    uint64_t synced = test_now_ns();
    EXPECT_TRUE(synced - t0 >= ns); /* synchronisation waited for the kernel to end */
    EXPECT_EQ(p_cuStreamQuery(s), CUDA_SUCCESS);
    EXPECT_EQ(p_cuEventElapsedTime(&ms, start, end), CUDA_SUCCESS);
    /* The events bracket the kernel (at least its 20 ms) and lie between t0 and the return of
     * the synchronisation (on the host clock; 0.01 ms for the float's rounding). */
    EXPECT_TRUE(ms >= 19.5f && ms <= (float)(synced - t0) / 1e6f + 0.01f);
    EXPECT_EQ(p_cuEventRecord(untimed, s), CUDA_SUCCESS);
    EXPECT_EQ(p_cuEventElapsedTime(&ms, start, untimed), CUDA_ERROR_INVALID_HANDLE);
    EXPECT_EQ(p_cuLaunchKernel(f, 1, 1, 1, 2048, 1, 1, 0, s, params, NULL),
              CUDA_ERROR_INVALID_VALUE);
    EXPECT_EQ(p_cuLaunchKernel(f, 0, 1, 1, 1, 1, 1, 0, s, params, NULL), CUDA_ERROR_INVALID_VALUE);
    EXPECT_EQ(p_cuLaunchKernel(NULL, 1, 1, 1, 1, 1, 1, 0, s, params, NULL),
              CUDA_ERROR_INVALID_HANDLE);
    ns = 1000000;
    CUlaunchConfig cfg;
    memset(&cfg, 0, sizeof cfg);
    cfg.gridDimX = cfg.gridDimY = cfg.gridDimZ = 1;
    cfg.blockDimX = cfg.blockDimY = cfg.blockDimZ = 1;
    cfg.hStream = s;
    EXPECT_EQ(p_cuLaunchKernelEx(&cfg, f, params, NULL), CUDA_SUCCESS);
    EXPECT_EQ(p_cuLaunchCooperativeKernel(f, 1, 1, 1, 1, 1, 1, 0, s, params), CUDA_SUCCESS);
    EXPECT_EQ(p_cuLaunchCooperativeKernel(f, 1 << 20, 1, 1, 1024, 1, 1, 0, s, params),
              CUDA_ERROR_COOPERATIVE_LAUNCH_TOO_LARGE);
    CUgraph g = NULL;
    CUgraphNode node = NULL;
    CUgraphExec exec = NULL;
    CUDA_KERNEL_NODE_PARAMS_v2 kp;
    memset(&kp, 0, sizeof kp);
    kp.func = f;
    kp.gridDimX = kp.gridDimY = kp.gridDimZ = 1;
    kp.blockDimX = kp.blockDimY = kp.blockDimZ = 1;
    kp.kernelParams = params;
    EXPECT_EQ(p_cuGraphCreate(&g, 0), CUDA_SUCCESS);
    EXPECT_EQ(p_cuGraphAddKernelNode_v2(&node, g, NULL, 0, &kp), CUDA_SUCCESS);
    EXPECT_EQ(p_cuGraphInstantiateWithFlags(&exec, g, 0), CUDA_SUCCESS);
    EXPECT_EQ(p_cuGraphLaunch(exec, s), CUDA_SUCCESS);
    EXPECT_EQ(p_cuStreamSynchronize(s), CUDA_SUCCESS);
    EXPECT_EQ(p_cuGraphExecDestroy(exec), CUDA_SUCCESS);
    EXPECT_EQ(p_cuGraphDestroy(g), CUDA_SUCCESS);
    EXPECT_EQ(p_cuEventDestroy_v2(start), CUDA_SUCCESS);
    EXPECT_EQ(p_cuEventDestroy_v2(end), CUDA_SUCCESS);
    EXPECT_EQ(p_cuEventDestroy_v2(untimed), CUDA_SUCCESS);
    EXPECT_EQ(p_cuStreamDestroy_v2(s), CUDA_SUCCESS);
    EXPECT_EQ(p_cuModuleUnload(m), CUDA_SUCCESS);
    EXPECT_EQ(p_cuModuleUnload(m), CUDA_ERROR_INVALID_HANDLE);
}

/* Stream capture: launches on a capturing stream are recorded into a graph, not run; launching
 * the graph runs them. Only one capture per stream; the legacy default stream cannot capture. */
static CUgraphExec instantiate_captured(CUgraph g)
{
    LOAD(lib, cuGraphInstantiateWithFlags);
    CUgraphExec exec = NULL;
    EXPECT_EQ(p_cuGraphInstantiateWithFlags(&exec, g, 0), CUDA_SUCCESS);
    return exec;
}

/* The elapsed time of one launch of `exec` between two events, in ms. It must cover the graph's
 * kernels and lie within the host time from before the first event was recorded to the return of
 * the synchronisation on the second (0.01 ms for the float's rounding); 0 when it does not. */
static float timed_graph_launch(CUgraphExec exec, CUstream s)
{
    LOAD(lib, cuEventCreate);
    LOAD(lib, cuEventRecord);
    LOAD(lib, cuEventSynchronize);
    LOAD(lib, cuEventElapsedTime);
    LOAD(lib, cuGraphLaunch);
    CUevent a = NULL, b = NULL;
    float ms = -1;
    EXPECT_EQ(p_cuEventCreate(&a, 0), CUDA_SUCCESS);
    EXPECT_EQ(p_cuEventCreate(&b, 0), CUDA_SUCCESS);
    uint64_t t0 = test_now_ns();
    EXPECT_EQ(p_cuEventRecord(a, s), CUDA_SUCCESS);
    EXPECT_EQ(p_cuGraphLaunch(exec, s), CUDA_SUCCESS);
    EXPECT_EQ(p_cuEventRecord(b, s), CUDA_SUCCESS);
    EXPECT_EQ(p_cuEventSynchronize(b), CUDA_SUCCESS);
    uint64_t synced = test_now_ns();
    EXPECT_EQ(p_cuEventElapsedTime(&ms, a, b), CUDA_SUCCESS);
    bool within = ms <= (float)(synced - t0) / 1e6f + 0.01f;
    EXPECT_TRUE(within);
    return within ? ms : 0;
}

static void capture(void)
{
    LOAD(lib, cuModuleLoadData);
    LOAD(lib, cuModuleGetFunction);
    LOAD(lib, cuLaunchKernel);
    LOAD(lib, cuLaunchKernel_ptsz);
    LOAD(lib, cuLaunchKernelEx);
    LOAD(lib, cuStreamCreate);
    LOAD(lib, cuStreamQuery);
    LOAD(lib, cuStreamDestroy_v2);
    LOAD(lib, cuStreamIsCapturing);
    LOAD(lib, cuStreamIsCapturing_ptsz);
    LOAD(lib, cuStreamBeginCapture);
    LOAD(lib, cuStreamBeginCapture_v2);
    LOAD(lib, cuStreamBeginCapture_v2_ptsz);
    LOAD(lib, cuStreamEndCapture);
    LOAD(lib, cuStreamEndCapture_ptsz);
    LOAD(lib, cuGraphLaunch);
    LOAD(lib, cuGraphExecDestroy);
    LOAD(lib, cuGraphDestroy);
    CUmodule m = NULL;
    CUfunction f = NULL;
    CUstream s = NULL, other = NULL;
    CUgraph g = NULL, again = NULL;
    CUstreamCaptureStatus st = CU_STREAM_CAPTURE_STATUS_NONE;
    uint64_t ns = 20 * 1000000ULL;
    void *params[] = {&ns};
    EXPECT_EQ(p_cuModuleLoadData(&m, sleep_kernel_ptx), CUDA_SUCCESS);
    EXPECT_EQ(p_cuModuleGetFunction(&f, m, "simgpu_sleep_ns"), CUDA_SUCCESS);
    EXPECT_EQ(p_cuStreamCreate(&s, CU_STREAM_NON_BLOCKING), CUDA_SUCCESS);
    EXPECT_EQ(p_cuStreamEndCapture(s, &g), CUDA_ERROR_ILLEGAL_STATE); /* not capturing */
    EXPECT_EQ(p_cuStreamBeginCapture_v2(s, 0), CUDA_SUCCESS);
    EXPECT_EQ(p_cuStreamBeginCapture_v2(s, 0), CUDA_ERROR_ILLEGAL_STATE); /* already */
    EXPECT_EQ(p_cuStreamIsCapturing(s, &st), CUDA_SUCCESS);
    EXPECT_EQ(st, CU_STREAM_CAPTURE_STATUS_ACTIVE);
    EXPECT_EQ(p_cuStreamIsCapturing(NULL, &st), CUDA_SUCCESS);
    EXPECT_EQ(st, CU_STREAM_CAPTURE_STATUS_NONE);
    /* Two 20 ms kernels recorded: nothing runs, the stream stays idle. Had they run, or had the
     * launches waited for them, the stream would be busy, or the launches would have taken,
     * until 40 ms after t: so an answer "idle" received sooner proves it. A thread descheduled
     * for 40 ms cannot tell; such a try is abandoned (its graph destroyed) and the capture made
     * again, up to 100 times (it costs no GPU time). */
    CUlaunchConfig cfg;
    memset(&cfg, 0, sizeof cfg);
    cfg.gridDimX = cfg.gridDimY = cfg.gridDimZ = 1;
    cfg.blockDimX = cfg.blockDimY = cfg.blockDimZ = 1;
    cfg.hStream = s;
    bool conclusive = false;
    for (int attempt = 0; attempt < 100 && !conclusive; attempt++) {
        if (attempt > 0) {
            EXPECT_EQ(p_cuStreamEndCapture(s, &g), CUDA_SUCCESS);
            EXPECT_EQ(p_cuGraphDestroy(g), CUDA_SUCCESS);
            EXPECT_EQ(p_cuStreamBeginCapture_v2(s, 0), CUDA_SUCCESS);
        }
        uint64_t t = test_now_ns();
        EXPECT_EQ(p_cuLaunchKernel(f, 1, 1, 1, 1, 1, 1, 0, s, params, NULL), CUDA_SUCCESS);
        EXPECT_EQ(p_cuLaunchKernelEx(&cfg, f, params, NULL), CUDA_SUCCESS);
        EXPECT_EQ(p_cuStreamQuery(s), CUDA_SUCCESS);
        conclusive = test_now_ns() - t < 2 * ns;
    }
    EXPECT_TRUE(conclusive);
    EXPECT_EQ(p_cuStreamEndCapture(s, &g), CUDA_SUCCESS);
    EXPECT_EQ(p_cuStreamIsCapturing(s, &st), CUDA_SUCCESS);
    EXPECT_EQ(st, CU_STREAM_CAPTURE_STATUS_NONE);
    /* Launching the graph runs both kernels: 40 ms on the timeline. */
    CUgraphExec exec = instantiate_captured(g);
    float ms = timed_graph_launch(exec, s);
    EXPECT_TRUE(ms >= 39.5f);
    /* A graph launched into a capturing stream is recorded too; the per-thread default stream
     * can capture (through the _ptsz entry points). */
    EXPECT_EQ(p_cuStreamBeginCapture_v2_ptsz(NULL, 0), CUDA_SUCCESS);
    EXPECT_EQ(p_cuStreamIsCapturing_ptsz(NULL, &st), CUDA_SUCCESS);
    EXPECT_EQ(st, CU_STREAM_CAPTURE_STATUS_ACTIVE);
    EXPECT_EQ(p_cuGraphLaunch(exec, CU_STREAM_PER_THREAD), CUDA_SUCCESS);
    EXPECT_EQ(p_cuLaunchKernel_ptsz(f, 1, 1, 1, 1, 1, 1, 0, NULL, params, NULL), CUDA_SUCCESS);
    EXPECT_EQ(p_cuStreamEndCapture_ptsz(NULL, &again), CUDA_SUCCESS);
    CUgraphExec exec_again = instantiate_captured(again);
    ms = timed_graph_launch(exec_again, s);
    EXPECT_TRUE(ms >= 59.5f);
    /* A stream destroyed while capturing abandons its capture (cuStreamBeginCapture: v1). */
    EXPECT_EQ(p_cuStreamCreate(&other, 0), CUDA_SUCCESS);
    EXPECT_EQ(p_cuStreamBeginCapture(other), CUDA_SUCCESS);
    EXPECT_EQ(p_cuStreamDestroy_v2(other), CUDA_SUCCESS);
    EXPECT_EQ(p_cuGraphExecDestroy(exec_again), CUDA_SUCCESS);
    EXPECT_EQ(p_cuGraphExecDestroy(exec), CUDA_SUCCESS);
    EXPECT_EQ(p_cuGraphDestroy(again), CUDA_SUCCESS);
    EXPECT_EQ(p_cuGraphDestroy(g), CUDA_SUCCESS);
    EXPECT_EQ(p_cuStreamDestroy_v2(s), CUDA_SUCCESS);
}

/* The per-thread default stream: the _ptsz/_ptds entry points' NULL stream is the calling
 * thread's own stream, which does not wait for other threads' work (the legacy default stream
 * waits for every blocking stream, per-thread default streams included). */
struct other_thread {
    CUcontext ctx;
    CUdeviceptr dev;
    int query_rc, ptds_copy_rc, legacy_copy_rc;
    uint64_t ptds_copy_done_ns, legacy_copy_done_ns; /* host clock when each copy returned */
};

static void *other_thread_main(void *arg)
{
    LOAD(lib, cuCtxSetCurrent);
    LOAD(lib, cuStreamQuery_ptsz);
    LOAD(lib, cuMemcpyHtoD_v2_ptds);
    LOAD(lib, cuMemcpyHtoD_v2);
    struct other_thread *o = arg;
    char buf[64] = {0};
    p_cuCtxSetCurrent(o->ctx);
    o->query_rc = p_cuStreamQuery_ptsz(NULL);
    o->ptds_copy_rc = p_cuMemcpyHtoD_v2_ptds(o->dev, buf, sizeof buf);
    o->ptds_copy_done_ns = test_now_ns();
    o->legacy_copy_rc = p_cuMemcpyHtoD_v2(o->dev, buf, sizeof buf);
    o->legacy_copy_done_ns = test_now_ns();
    return NULL;
}

static void per_thread_default_stream(void)
{
    LOAD(lib, cuModuleLoadData);
    LOAD(lib, cuModuleGetFunction);
    LOAD(lib, cuModuleUnload);
    LOAD(lib, cuCtxGetCurrent);
    LOAD(lib, cuMemAlloc_v2);
    LOAD(lib, cuMemFree_v2);
    LOAD(lib, cuLaunchKernel_ptsz);
    LOAD(lib, cuStreamQuery_ptsz);
    LOAD(lib, cuStreamQuery);
    LOAD(lib, cuStreamSynchronize_ptsz);
    const uint64_t ms = 1000000ULL;
    CUmodule m = NULL;
    CUfunction f = NULL;
    uint64_t ns = 300 * ms;
    void *params[] = {&ns};
    struct other_thread o;
    memset(&o, 0, sizeof o);
    EXPECT_EQ(p_cuModuleLoadData(&m, sleep_kernel_ptx), CUDA_SUCCESS);
    EXPECT_EQ(p_cuModuleGetFunction(&f, m, "simgpu_sleep_ns"), CUDA_SUCCESS);
    EXPECT_EQ(p_cuCtxGetCurrent(&o.ctx), CUDA_SUCCESS);
    EXPECT_EQ(p_cuMemAlloc_v2(&o.dev, 64), CUDA_SUCCESS);
    /* The 300 ms kernel cannot end before t + 300 ms (t is read before it is queued), so a query
     * answered before then must say "not ready", and a copy that returns before then did not
     * wait for it; one that waits cannot return sooner. "Before then" is judged by the host
     * clock after the call. A thread descheduled that long proves nothing: the queries are then
     * counted as unchecked, and the whole exchange is made again (up to 3 times) until the
     * per-thread copy is seen to return early - a copy that always waits fails. */
    bool copy_returned_early = false;
    for (int attempt = 0; attempt < 3 && !copy_returned_early; attempt++) {
        uint64_t t = test_now_ns();
        EXPECT_EQ(p_cuLaunchKernel_ptsz(f, 1, 1, 1, 1, 1, 1, 0, NULL, params, NULL),
                  CUDA_SUCCESS);
        CUresult own = p_cuStreamQuery_ptsz(NULL);
        CUresult named = p_cuStreamQuery(CU_STREAM_PER_THREAD);
        if (test_now_ns() - t < ns) {
            EXPECT_EQ(own, CUDA_ERROR_NOT_READY);
            EXPECT_EQ(named, CUDA_ERROR_NOT_READY);
        } else {
            test_unchecked += 2;
        }
        pthread_t th;
        EXPECT_EQ(pthread_create(&th, NULL, other_thread_main, &o), 0);
        pthread_join(th, NULL);
        EXPECT_EQ(o.query_rc, CUDA_SUCCESS);     /* its own per-thread stream is idle */
        EXPECT_EQ(o.ptds_copy_rc, CUDA_SUCCESS); /* ... so its synchronous copy does not wait */
        copy_returned_early = o.ptds_copy_done_ns - t < ns;
        EXPECT_EQ(o.legacy_copy_rc, CUDA_SUCCESS); /* the legacy one waits for our kernel */
        EXPECT_TRUE(o.legacy_copy_done_ns - t >= ns);
        EXPECT_EQ(p_cuStreamSynchronize_ptsz(NULL), CUDA_SUCCESS);
        EXPECT_EQ(p_cuStreamQuery_ptsz(NULL), CUDA_SUCCESS);
    }
    EXPECT_TRUE(copy_returned_early);
    EXPECT_EQ(p_cuMemFree_v2(o.dev), CUDA_SUCCESS);
    EXPECT_EQ(p_cuModuleUnload(m), CUDA_SUCCESS);
}

/* cuGetProcAddress(name, version, flags) must give exactly the symbol dlsym gives for `want`. */
static void expect_proc(const char *name, int version, cuuint64_t flags, const char *want)
{
    LOAD(lib, cuGetProcAddress_v2);
    void *fn = NULL;
    CUdriverProcAddressQueryResult status = CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND;
    CUresult rc = p_cuGetProcAddress_v2(name, &fn, version, flags, &status);
    if (rc != CUDA_SUCCESS || status != CU_GET_PROC_ADDRESS_SUCCESS || fn != dlsym(lib, want)) {
        fprintf(stderr, "cuGetProcAddress(%s, %d, %llu) = %d/%d, not %s\n", name, version,
                (unsigned long long)flags, (int)rc, (int)status, want);
        test_failures++;
    }
}

static void proc_address(void)
{
    LOAD(lib, cuGetProcAddress);
    LOAD(lib, cuGetProcAddress_v2);
    LOAD(lib, cuGetProcAddress_v2_ptsz);
    void *fn = NULL;
    CUdriverProcAddressQueryResult status = CU_GET_PROC_ADDRESS_SUCCESS;
    EXPECT_EQ(p_cuGetProcAddress("cuMemAlloc", &fn, 12000, 0), CUDA_SUCCESS);
    EXPECT_TRUE(fn == dlsym(lib, "cuMemAlloc_v2"));
    EXPECT_EQ(p_cuGetProcAddress("cuCtxCreate", &fn, 3020, 0), CUDA_SUCCESS);
    EXPECT_TRUE(fn == dlsym(lib, "cuCtxCreate_v2"));
    EXPECT_EQ(p_cuGetProcAddress_v2("cuMemFree", &fn, 12000, CU_GET_PROC_ADDRESS_DEFAULT,
                                    &status),
              CUDA_SUCCESS);
    EXPECT_EQ(status, CU_GET_PROC_ADDRESS_SUCCESS);
    EXPECT_TRUE(fn == dlsym(lib, "cuMemFree_v2"));
    EXPECT_EQ(p_cuGetProcAddress_v2("cuNoSuchFunction", &fn, 12000, 0, &status),
              CUDA_ERROR_NOT_FOUND);
    EXPECT_EQ(status, CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND);
    EXPECT_TRUE(fn == NULL);
    EXPECT_EQ(p_cuGetProcAddress_v2("cuMemAllocAsync", &fn, 10000, 0, &status),
              CUDA_ERROR_NOT_FOUND);
    EXPECT_EQ(status, CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT);
    EXPECT_EQ(p_cuGetProcAddress(NULL, &fn, 12000, 0), CUDA_ERROR_INVALID_VALUE);

    /* The requested version picks the ABI. */
    expect_proc("cuCtxCreate", 11040, 0, "cuCtxCreate_v3");
    expect_proc("cuGetProcAddress", 11030, 0, "cuGetProcAddress");
    expect_proc("cuGetProcAddress", 12000, 0, "cuGetProcAddress_v2");
    expect_proc("cuDevicePrimaryCtxRelease", 7000, 0, "cuDevicePrimaryCtxRelease");
    expect_proc("cuDevicePrimaryCtxRelease", 11000, 0, "cuDevicePrimaryCtxRelease_v2");

    /* Default and legacy flags give the legacy-stream functions; the per-thread flag gives the
     * _ptsz/_ptds variants where they exist and the plain function where none does. */
    static const struct {
        const char *name, *legacy, *per_thread;
    } streamed[] = {
        {"cuLaunchKernel", "cuLaunchKernel", "cuLaunchKernel_ptsz"},
        {"cuLaunchKernelEx", "cuLaunchKernelEx", "cuLaunchKernelEx_ptsz"},
        {"cuLaunchCooperativeKernel", "cuLaunchCooperativeKernel",
         "cuLaunchCooperativeKernel_ptsz"},
        {"cuGraphLaunch", "cuGraphLaunch", "cuGraphLaunch_ptsz"},
        {"cuMemcpyHtoD", "cuMemcpyHtoD_v2", "cuMemcpyHtoD_v2_ptds"},
        {"cuMemcpyDtoH", "cuMemcpyDtoH_v2", "cuMemcpyDtoH_v2_ptds"},
        {"cuMemcpyDtoD", "cuMemcpyDtoD_v2", "cuMemcpyDtoD_v2_ptds"},
        {"cuMemcpy", "cuMemcpy", "cuMemcpy_ptds"},
        {"cuMemcpyHtoDAsync", "cuMemcpyHtoDAsync_v2", "cuMemcpyHtoDAsync_v2_ptsz"},
        {"cuMemcpyDtoHAsync", "cuMemcpyDtoHAsync_v2", "cuMemcpyDtoHAsync_v2_ptsz"},
        {"cuMemcpyAsync", "cuMemcpyAsync", "cuMemcpyAsync_ptsz"},
        {"cuMemsetD8", "cuMemsetD8_v2", "cuMemsetD8_v2_ptds"},
        {"cuMemsetD32", "cuMemsetD32_v2", "cuMemsetD32_v2_ptds"},
        {"cuMemsetD8Async", "cuMemsetD8Async", "cuMemsetD8Async_ptsz"},
        {"cuMemsetD32Async", "cuMemsetD32Async", "cuMemsetD32Async_ptsz"},
        {"cuMemAllocAsync", "cuMemAllocAsync", "cuMemAllocAsync_ptsz"},
        {"cuMemFreeAsync", "cuMemFreeAsync", "cuMemFreeAsync_ptsz"},
        {"cuMemAllocFromPoolAsync", "cuMemAllocFromPoolAsync", "cuMemAllocFromPoolAsync_ptsz"},
        {"cuStreamSynchronize", "cuStreamSynchronize", "cuStreamSynchronize_ptsz"},
        {"cuStreamQuery", "cuStreamQuery", "cuStreamQuery_ptsz"},
        {"cuStreamWaitEvent", "cuStreamWaitEvent", "cuStreamWaitEvent_ptsz"},
        {"cuStreamGetCtx", "cuStreamGetCtx", "cuStreamGetCtx_ptsz"},
        {"cuStreamIsCapturing", "cuStreamIsCapturing", "cuStreamIsCapturing_ptsz"},
        {"cuStreamBeginCapture", "cuStreamBeginCapture_v2", "cuStreamBeginCapture_v2_ptsz"},
        {"cuStreamEndCapture", "cuStreamEndCapture", "cuStreamEndCapture_ptsz"},
        {"cuEventRecord", "cuEventRecord", "cuEventRecord_ptsz"},
        {"cuGetProcAddress", "cuGetProcAddress_v2", "cuGetProcAddress_v2_ptsz"},
        {"cuMemAlloc", "cuMemAlloc_v2", "cuMemAlloc_v2"},
        {"cuStreamCreate", "cuStreamCreate", "cuStreamCreate"},
    };
    for (size_t i = 0; i < sizeof streamed / sizeof streamed[0]; i++) {
        expect_proc(streamed[i].name, 12000, CU_GET_PROC_ADDRESS_DEFAULT, streamed[i].legacy);
        expect_proc(streamed[i].name, 12000, CU_GET_PROC_ADDRESS_LEGACY_STREAM,
                    streamed[i].legacy);
        expect_proc(streamed[i].name, 12000, CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM,
                    streamed[i].per_thread);
    }
    /* What cuda.h calls cuGetProcAddress under per-thread compilation defaults to per-thread. */
    EXPECT_EQ(p_cuGetProcAddress_v2_ptsz("cuLaunchKernel", &fn, 12000,
                                         CU_GET_PROC_ADDRESS_DEFAULT, &status),
              CUDA_SUCCESS);
    EXPECT_TRUE(fn == dlsym(lib, "cuLaunchKernel_ptsz"));
    EXPECT_EQ(p_cuGetProcAddress_v2_ptsz("cuLaunchKernel", &fn, 12000,
                                         CU_GET_PROC_ADDRESS_LEGACY_STREAM, &status),
              CUDA_SUCCESS);
    EXPECT_TRUE(fn == dlsym(lib, "cuLaunchKernel"));
}

int main(void)
{
    setvbuf(stdout, NULL, _IOLBF, 0);
    lib = test_open("TEST_LIBCUDA", "libcuda.so.1");
    before_init();
    devices();
    contexts();
    memory();
    pools_and_async();
    pool_cache();
    vmm();
    arrays();
    execution();
    capture();
    per_thread_default_stream();
    proc_address();
    test_report_unchecked();
    if (test_failures > 0) {
        printf("FAIL %d\n", test_failures);
        return 1;
    }
    printf("PASS\n");
    return 0;
}
