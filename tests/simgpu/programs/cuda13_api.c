/*
 * What a client built for CUDA 13 gets from a CUDA 13 driver, and what it does not get from a
 * CUDA 12 one: cuGetProcAddress bounded by the driver's version, the entry points whose ABI
 * CUDA 13 changed (contexts named explicitly, pools named by location), and VMM handles retained
 * from a mapped address. Usage: cuda13_api <driver's CUDA version, as cuDriverGetVersion gives
 * it>. Exit status 0 and "PASS" when every check holds; each failed check is reported on stderr.
 * Loads the driver with dlopen, so it runs unchanged against NVIDIA's libcuda.
 */
#include <stdlib.h>
#include <unistd.h>

#include "simgpu_test.h"

static void *lib;
static int driver;

/* cuGetProcAddress_v2(name, version): the result, the symbol status and the function. */
static CUresult lookup(const char *name, int version, CUdriverProcAddressQueryResult *status,
                       void **fn)
{
    LOAD(lib, cuGetProcAddress_v2);
    *fn = (void *)1;
    *status = (CUdriverProcAddressQueryResult)-1;
    return p_cuGetProcAddress_v2(name, fn, version, CU_GET_PROC_ADDRESS_DEFAULT, status);
}

/* (name, version) resolves to exactly the symbol dlsym gives for `want`. */
static void expect_proc(const char *name, int version, const char *want)
{
    CUdriverProcAddressQueryResult status;
    void *fn;
    CUresult rc = lookup(name, version, &status, &fn);
    if (rc != CUDA_SUCCESS || status != CU_GET_PROC_ADDRESS_SUCCESS || fn != dlsym(lib, want)) {
        fprintf(stderr, "cuGetProcAddress(%s, %d) = %d/%d, not %s\n", name, version, (int)rc,
                (int)status, want);
        test_failures++;
    }
}

/* (name, version) is refused with `rc` and `want`, and a NULL function. */
static void expect_refused(const char *name, int version, CUresult rc,
                           CUdriverProcAddressQueryResult want)
{
    CUdriverProcAddressQueryResult status;
    void *fn;
    CUresult got = lookup(name, version, &status, &fn);
    if (got != rc || status != want || fn != NULL) {
        fprintf(stderr, "cuGetProcAddress(%s, %d) = %d/%d/%p, expected %d/%d/NULL\n", name,
                version, (int)got, (int)status, fn, (int)rc, (int)want);
        test_failures++;
    }
}

static void proc_address(void)
{
    /* Whatever the driver, a version above it is refused, as CUDA documents. */
    expect_refused("cuMemAlloc", driver + 10, CUDA_ERROR_INVALID_VALUE,
                   CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND);
    expect_proc("cuMemAlloc", driver, "cuMemAlloc_v2");
    expect_proc("cuStreamGetCtx", 12040, "cuStreamGetCtx");
    expect_proc("cuMemRetainAllocationHandle", 11000, "cuMemRetainAllocationHandle");
    expect_proc("cuMemGetAllocationPropertiesFromHandle", 10020,
                "cuMemGetAllocationPropertiesFromHandle");
    if (driver >= 13000) {
        expect_proc("cuStreamGetCtx", 12050, "cuStreamGetCtx_v2");
        /* The ABIs CUDA 13.0 introduced, for a client that asks for them... */
        expect_proc("cuCtxSynchronize", 13000, "cuCtxSynchronize_v2");
        expect_proc("cuCtxGetDevice", 13000, "cuCtxGetDevice_v2");
        expect_proc("cuMemGetMemPool", 13000, "cuMemGetMemPool");
        expect_proc("cuMemGetDefaultMemPool", 13000, "cuMemGetDefaultMemPool");
        expect_proc("cuMemSetMemPool", 13000, "cuMemSetMemPool");
        /* ... and the older ones for a client that asks for those. */
        expect_proc("cuCtxSynchronize", 12090, "cuCtxSynchronize");
        expect_proc("cuCtxGetDevice", 2000, "cuCtxGetDevice");
        expect_refused("cuMemGetMemPool", 12090, CUDA_ERROR_NOT_FOUND,
                       CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT);
    } else {
        /* A CUDA 12 driver has none of them: the newest ABI it has, or no such symbol. */
        expect_proc("cuCtxSynchronize", driver, "cuCtxSynchronize");
        expect_proc("cuCtxGetDevice", driver, "cuCtxGetDevice");
        expect_refused("cuMemGetMemPool", driver, CUDA_ERROR_NOT_FOUND,
                       CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND);
        expect_refused("cuCtxSynchronize", 13000, CUDA_ERROR_INVALID_VALUE,
                       CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND);
    }
}

/* cuCtxSynchronize_v2 and cuCtxGetDevice_v2 act on the context they name, current or not;
 * cuStreamGetCtx_v2 reports no green context. */
static void named_contexts(void)
{
    LOAD(lib, cuCtxCreate_v2);
    LOAD(lib, cuCtxDestroy_v2);
    LOAD(lib, cuCtxPopCurrent_v2);
    LOAD(lib, cuCtxGetDevice_v2);
    LOAD(lib, cuCtxSynchronize_v2);
    LOAD(lib, cuStreamGetCtx_v2);
    LOAD(lib, cuStreamGetCtx_v2_ptsz);
    LOAD(lib, cuDeviceGetCount);
    int n = 0;
    EXPECT_EQ(p_cuDeviceGetCount(&n), CUDA_SUCCESS);
    CUcontext a = NULL, b = NULL, popped = NULL;
    EXPECT_EQ(p_cuCtxCreate_v2(&a, 0, n - 1), CUDA_SUCCESS); /* the last device */
    EXPECT_EQ(p_cuCtxPopCurrent_v2(&popped), CUDA_SUCCESS);  /* not current any more */
    EXPECT_TRUE(popped == a);
    EXPECT_EQ(p_cuCtxCreate_v2(&b, 0, 0), CUDA_SUCCESS); /* current */
    CUdevice dev = -1;
    EXPECT_EQ(p_cuCtxGetDevice_v2(&dev, a), CUDA_SUCCESS);
    EXPECT_EQ(dev, n - 1);
    EXPECT_EQ(p_cuCtxGetDevice_v2(&dev, NULL), CUDA_SUCCESS);
    EXPECT_EQ(dev, 0);
    EXPECT_EQ(p_cuCtxGetDevice_v2(NULL, a), CUDA_ERROR_INVALID_VALUE);
    EXPECT_EQ(p_cuCtxSynchronize_v2(a), CUDA_SUCCESS);
    EXPECT_EQ(p_cuCtxSynchronize_v2(NULL), CUDA_SUCCESS);

    CUcontext owner = NULL;
    CUgreenCtx green = (CUgreenCtx)1;
    EXPECT_EQ(p_cuStreamGetCtx_v2(NULL, &owner, &green), CUDA_SUCCESS);
    EXPECT_TRUE(owner == b && green == NULL);
    green = (CUgreenCtx)1;
    EXPECT_EQ(p_cuStreamGetCtx_v2_ptsz(NULL, &owner, &green), CUDA_SUCCESS);
    EXPECT_TRUE(owner == b && green == NULL);
    EXPECT_EQ(p_cuStreamGetCtx_v2(NULL, &owner, NULL), CUDA_ERROR_INVALID_VALUE);
    EXPECT_EQ(p_cuStreamGetCtx_v2(NULL, NULL, &green), CUDA_ERROR_INVALID_VALUE);
    EXPECT_EQ(p_cuStreamGetCtx_v2_ptsz(NULL, &owner, NULL), CUDA_ERROR_INVALID_VALUE);

    EXPECT_EQ(p_cuCtxDestroy_v2(a), CUDA_SUCCESS);
    EXPECT_EQ(p_cuCtxGetDevice_v2(&dev, a), CUDA_ERROR_INVALID_CONTEXT);
    EXPECT_EQ(p_cuCtxSynchronize_v2(a), CUDA_ERROR_INVALID_CONTEXT);
    EXPECT_EQ(p_cuCtxDestroy_v2(b), CUDA_SUCCESS);
    EXPECT_EQ(p_cuCtxSynchronize_v2(NULL), CUDA_ERROR_INVALID_CONTEXT);
}

/* Pools named by location: a device's pinned pool is its cuDeviceGetMemPool pool; host and
 * managed pools are not simulated. */
static void located_pools(void)
{
    LOAD(lib, cuDevicePrimaryCtxRetain);
    LOAD(lib, cuCtxSetCurrent);
    LOAD(lib, cuDeviceGetMemPool);
    LOAD(lib, cuDeviceGetDefaultMemPool);
    LOAD(lib, cuMemGetMemPool);
    LOAD(lib, cuMemGetDefaultMemPool);
    LOAD(lib, cuMemSetMemPool);
    LOAD(lib, cuMemPoolCreate);
    LOAD(lib, cuMemPoolDestroy);
    CUcontext ctx = NULL;
    EXPECT_EQ(p_cuDevicePrimaryCtxRetain(&ctx, 0), CUDA_SUCCESS);
    EXPECT_EQ(p_cuCtxSetCurrent(ctx), CUDA_SUCCESS);
    CUmemLocation dev0 = {CU_MEM_LOCATION_TYPE_DEVICE, 0};
    CUmemLocation host = {CU_MEM_LOCATION_TYPE_HOST, 0};
    CUmemoryPool by_device = NULL, by_location = NULL, made = NULL;
    EXPECT_EQ(p_cuDeviceGetDefaultMemPool(&by_device, 0), CUDA_SUCCESS);
    EXPECT_EQ(p_cuMemGetDefaultMemPool(&by_location, &dev0, CU_MEM_ALLOCATION_TYPE_PINNED),
              CUDA_SUCCESS);
    EXPECT_TRUE(by_location == by_device);

    CUmemPoolProps props;
    memset(&props, 0, sizeof props);
    props.allocType = CU_MEM_ALLOCATION_TYPE_PINNED;
    props.location = dev0;
    EXPECT_EQ(p_cuMemPoolCreate(&made, &props), CUDA_SUCCESS);
    EXPECT_EQ(p_cuMemSetMemPool(&dev0, CU_MEM_ALLOCATION_TYPE_PINNED, made), CUDA_SUCCESS);
    EXPECT_EQ(p_cuMemGetMemPool(&by_location, &dev0, CU_MEM_ALLOCATION_TYPE_PINNED),
              CUDA_SUCCESS);
    EXPECT_TRUE(by_location == made);
    EXPECT_EQ(p_cuDeviceGetMemPool(&by_device, 0), CUDA_SUCCESS);
    EXPECT_TRUE(by_device == made);
    EXPECT_EQ(p_cuMemSetMemPool(&dev0, CU_MEM_ALLOCATION_TYPE_PINNED, by_location),
              CUDA_SUCCESS);

    EXPECT_EQ(p_cuMemGetMemPool(&by_location, &host, CU_MEM_ALLOCATION_TYPE_PINNED),
              CUDA_ERROR_NOT_SUPPORTED);
    EXPECT_EQ(p_cuMemGetMemPool(&by_location, &dev0, CU_MEM_ALLOCATION_TYPE_MANAGED),
              CUDA_ERROR_NOT_SUPPORTED);
    EXPECT_EQ(p_cuMemGetMemPool(&by_location, &dev0, CU_MEM_ALLOCATION_TYPE_INVALID),
              CUDA_ERROR_INVALID_VALUE);
    EXPECT_EQ(p_cuMemGetMemPool(&by_location, NULL, CU_MEM_ALLOCATION_TYPE_PINNED),
              CUDA_ERROR_INVALID_VALUE);
    EXPECT_EQ(p_cuMemGetMemPool(NULL, &dev0, CU_MEM_ALLOCATION_TYPE_PINNED),
              CUDA_ERROR_INVALID_VALUE);
    CUmemLocation missing = {CU_MEM_LOCATION_TYPE_DEVICE, 99};
    EXPECT_EQ(p_cuMemGetDefaultMemPool(&by_location, &missing, CU_MEM_ALLOCATION_TYPE_PINNED),
              CUDA_ERROR_INVALID_DEVICE);
    EXPECT_EQ(p_cuMemSetMemPool(&host, CU_MEM_ALLOCATION_TYPE_PINNED, made),
              CUDA_ERROR_NOT_SUPPORTED);
    EXPECT_EQ(p_cuMemSetMemPool(&dev0, CU_MEM_ALLOCATION_TYPE_PINNED, NULL),
              CUDA_ERROR_INVALID_VALUE);
    /* Nor can such a pool be made (cuda.core's pinned and managed memory resources ask). */
    CUmemoryPool other = NULL;
    props.location = host;
    EXPECT_EQ(p_cuMemPoolCreate(&other, &props), CUDA_ERROR_NOT_SUPPORTED);
    props.location = dev0;
    props.allocType = CU_MEM_ALLOCATION_TYPE_MANAGED;
    EXPECT_EQ(p_cuMemPoolCreate(&other, &props), CUDA_ERROR_NOT_SUPPORTED);
    EXPECT_EQ(p_cuMemPoolDestroy(made), CUDA_SUCCESS);
}

/* The handle behind a mapped address: one more handle reference per retain, each released on
 * its own; the memory returns to the device after the last release and the last unmapping. */
static void retained_handles(void)
{
    LOAD(lib, cuMemCreate);
    LOAD(lib, cuMemRelease);
    LOAD(lib, cuMemAddressReserve);
    LOAD(lib, cuMemAddressFree);
    LOAD(lib, cuMemMap);
    LOAD(lib, cuMemUnmap);
    LOAD(lib, cuMemGetInfo_v2);
    LOAD(lib, cuMemRetainAllocationHandle);
    LOAD(lib, cuMemGetAllocationPropertiesFromHandle);
    LOAD(lib, cuMemExportToShareableHandle);
    LOAD(lib, cuMemImportFromShareableHandle);
    const size_t gran = 2u << 20;
    CUmemAllocationProp prop;
    memset(&prop, 0, sizeof prop);
    prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    prop.requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
    prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    prop.location.id = 0;
    size_t free_before = 0, free_now = 0, total = 0;
    EXPECT_EQ(p_cuMemGetInfo_v2(&free_before, &total), CUDA_SUCCESS);
    CUmemGenericAllocationHandle h = 0, again = 0;
    CUdeviceptr va = 0;
    EXPECT_EQ(p_cuMemCreate(&h, 2 * gran, &prop, 0), CUDA_SUCCESS);
    EXPECT_EQ(p_cuMemAddressReserve(&va, 4 * gran, 0, 0, 0), CUDA_SUCCESS);
    EXPECT_EQ(p_cuMemRetainAllocationHandle(&again, (void *)va), CUDA_ERROR_INVALID_VALUE);
    EXPECT_EQ(p_cuMemMap(va, 2 * gran, 0, h, 0), CUDA_SUCCESS);

    /* Any address inside the mapping names the handle; past it, none does. */
    EXPECT_EQ(p_cuMemRetainAllocationHandle(&again, (void *)(va + gran + 100)), CUDA_SUCCESS);
    EXPECT_TRUE(again == h);
    EXPECT_EQ(p_cuMemRetainAllocationHandle(&again, (void *)(va + 2 * gran)),
              CUDA_ERROR_INVALID_VALUE);
    EXPECT_EQ(p_cuMemRetainAllocationHandle(NULL, (void *)va), CUDA_ERROR_INVALID_VALUE);

    CUmemAllocationProp got;
    memset(&got, 0xff, sizeof got);
    EXPECT_EQ(p_cuMemGetAllocationPropertiesFromHandle(&got, h), CUDA_SUCCESS);
    EXPECT_EQ(got.type, CU_MEM_ALLOCATION_TYPE_PINNED);
    EXPECT_EQ(got.location.type, CU_MEM_LOCATION_TYPE_DEVICE);
    EXPECT_EQ(got.location.id, 0);
    EXPECT_EQ(got.requestedHandleTypes, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR);
    EXPECT_EQ(p_cuMemGetAllocationPropertiesFromHandle(NULL, h), CUDA_ERROR_INVALID_VALUE);
    /* An imported handle carries no properties the simulator knows. */
    int fd = -1;
    CUmemGenericAllocationHandle imported = 0;
    EXPECT_EQ(p_cuMemExportToShareableHandle(&fd, h, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0),
              CUDA_SUCCESS);
    EXPECT_EQ(p_cuMemImportFromShareableHandle(&imported, (void *)(intptr_t)fd,
                                               CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR),
              CUDA_SUCCESS);
    EXPECT_EQ(p_cuMemGetAllocationPropertiesFromHandle(&got, imported), CUDA_ERROR_NOT_SUPPORTED);
    EXPECT_EQ(p_cuMemRelease(imported), CUDA_SUCCESS);
    close(fd);

    /* Two handle references (create + retain): two releases, then the handle is gone. */
    EXPECT_EQ(p_cuMemRelease(h), CUDA_SUCCESS);
    EXPECT_EQ(p_cuMemGetAllocationPropertiesFromHandle(&got, h), CUDA_SUCCESS);
    EXPECT_EQ(p_cuMemRelease(h), CUDA_SUCCESS);
    EXPECT_EQ(p_cuMemRelease(h), CUDA_ERROR_INVALID_VALUE);
    EXPECT_EQ(p_cuMemGetAllocationPropertiesFromHandle(&got, h), CUDA_ERROR_INVALID_VALUE);
    EXPECT_EQ(p_cuMemGetInfo_v2(&free_now, &total), CUDA_SUCCESS);
    EXPECT_EQ(free_before - free_now, 2 * gran); /* still mapped */

    /* Released but mapped: retaining from the address brings the handle back, and that
     * reference, like any, keeps the memory after the unmapping. */
    EXPECT_EQ(p_cuMemRetainAllocationHandle(&again, (void *)va), CUDA_SUCCESS);
    EXPECT_TRUE(again == h);
    EXPECT_EQ(p_cuMemUnmap(va, 2 * gran), CUDA_SUCCESS);
    EXPECT_EQ(p_cuMemGetInfo_v2(&free_now, &total), CUDA_SUCCESS);
    EXPECT_EQ(free_before - free_now, 2 * gran);
    EXPECT_EQ(p_cuMemRelease(again), CUDA_SUCCESS);
    EXPECT_EQ(p_cuMemGetInfo_v2(&free_now, &total), CUDA_SUCCESS);
    EXPECT_EQ(free_now, free_before);
    EXPECT_EQ(p_cuMemRetainAllocationHandle(&again, (void *)va), CUDA_ERROR_INVALID_VALUE);
    EXPECT_EQ(p_cuMemAddressFree(va, 4 * gran), CUDA_SUCCESS);
}

int main(int argc, char **argv)
{
    setvbuf(stdout, NULL, _IOLBF, 0);
    if (argc != 2) {
        fprintf(stderr, "usage: %s CUDA_DRIVER_VERSION\n", argv[0]);
        return 2;
    }
    lib = test_open("TEST_LIBCUDA", "libcuda.so.1");
    LOAD(lib, cuDriverGetVersion);
    LOAD(lib, cuInit);
    EXPECT_EQ(p_cuDriverGetVersion(&driver), CUDA_SUCCESS);
    EXPECT_EQ(driver, atoi(argv[1]));
    proc_address(); /* before cuInit too, as clients load their entry points */
    EXPECT_EQ(p_cuInit(0), CUDA_SUCCESS);
    proc_address();
    named_contexts();
    located_pools();
    retained_handles();
    if (test_failures > 0) {
        printf("FAIL %d\n", test_failures);
        return 1;
    }
    printf("PASS\n");
    return 0;
}
