/*
 * What NVIDIA's Python clients (cuda.core, numba-cuda) need to create streams, load code and
 * launch kernels: stream priorities, flags and ids; libraries and kernels (cuLibrary*,
 * cuKernel*), a CUkernel launched in place of a CUfunction; module images as PTX, cubin and
 * fatbin; kernel parameter layouts; pointer attributes; occupancy. Usage: launch_api IMAGE_DIR,
 * where IMAGE_DIR holds simgpu_sleep_sm90.cubin and simgpu_sleep_sm80.cubin (tests/simgpu/images).
 * Expects device 0 to have compute capability 9.0 and a CUDA 12.8 driver or newer. The fatbins
 * are built here, in the layout the simulator reads.
 */
#include <stdbool.h>
#include <unistd.h>

#include "simgpu_test.h"

static void *lib;
static const char *image_dir;

/* Write bytes to a temporary file and return its path (static buffer). */
static const char *temp_file(const void *data, size_t size)
{
    static char path[] = "/tmp/launch_api_XXXXXX";
    strcpy(path, "/tmp/launch_api_XXXXXX");
    int fd = mkstemp(path);
    if (fd < 0 || write(fd, data, size) != (ssize_t)size) {
        fprintf(stderr, "cannot write a temporary file\n");
        exit(2);
    }
    close(fd);
    return path;
}

/* A fatbin holding the given entries: a 16-byte header, then per entry a 64-byte header
 * (kind, header size, payload size, architecture, flags) and the payload padded to 8 bytes. */
struct fat_entry {
    unsigned short kind; /* 1 PTX, 2 cubin */
    unsigned int arch;   /* e.g. 90 */
    const void *payload;
    size_t size;
};

static unsigned char *make_fatbin(const struct fat_entry *entries, int count)
{
    size_t body = 0;
    for (int i = 0; i < count; i++)
        body += 64 + ((entries[i].size + 7) & ~(size_t)7);
    unsigned char *fb = calloc(1, 16 + body);
    if (fb == NULL)
        exit(2);
    uint32_t magic = 0xBA55ED50u;
    uint16_t version = 1, header = 16;
    uint64_t body64 = body;
    memcpy(fb, &magic, 4);
    memcpy(fb + 4, &version, 2);
    memcpy(fb + 6, &header, 2);
    memcpy(fb + 8, &body64, 8);
    unsigned char *p = fb + 16;
    for (int i = 0; i < count; i++) {
        uint32_t hsize = 64, arch = entries[i].arch;
        uint64_t padded = (entries[i].size + 7) & ~(size_t)7, flags = 0x11;
        memcpy(p, &entries[i].kind, 2);
        memcpy(p + 4, &hsize, 4);
        memcpy(p + 8, &padded, 8);
        memcpy(p + 28, &arch, 4);
        memcpy(p + 40, &flags, 8);
        memcpy(p + 64, entries[i].payload, entries[i].size);
        p += 64 + padded;
    }
    return fb;
}

static void streams(void)
{
    LOAD(lib, cuCtxGetStreamPriorityRange);
    LOAD(lib, cuCtxGetId);
    LOAD(lib, cuCtxCreate_v2);
    LOAD(lib, cuCtxDestroy_v2);
    LOAD(lib, cuCtxSetCurrent);
    LOAD(lib, cuDevicePrimaryCtxRetain);
    LOAD(lib, cuStreamCreate);
    LOAD(lib, cuStreamCreateWithPriority);
    LOAD(lib, cuStreamGetPriority);
    LOAD(lib, cuStreamGetPriority_ptsz);
    LOAD(lib, cuStreamGetFlags);
    LOAD(lib, cuStreamGetId);
    LOAD(lib, cuStreamGetId_ptsz);
    LOAD(lib, cuStreamGetDevice);
    LOAD(lib, cuStreamDestroy_v2);
    int least = 99, greatest = 99, priority = 99;
    unsigned int flags = 99;
    unsigned long long id1 = 0, id2 = 0, again = 0, legacy = 0, per_thread = 0;
    CUstream high = NULL, low = NULL, clamped = NULL;
    EXPECT_EQ(p_cuCtxGetStreamPriorityRange(&least, &greatest), CUDA_SUCCESS);
    EXPECT_EQ(least, 0);
    EXPECT_EQ(greatest, -5);
    /* Either output may be NULL. */
    EXPECT_EQ(p_cuCtxGetStreamPriorityRange(NULL, &greatest), CUDA_SUCCESS);
    EXPECT_EQ(p_cuStreamCreateWithPriority(&high, CU_STREAM_NON_BLOCKING, -3), CUDA_SUCCESS);
    EXPECT_EQ(p_cuStreamGetPriority(high, &priority), CUDA_SUCCESS);
    EXPECT_EQ(priority, -3);
    EXPECT_EQ(p_cuStreamGetFlags(high, &flags), CUDA_SUCCESS);
    EXPECT_EQ(flags, CU_STREAM_NON_BLOCKING);
    /* Outside the range, a priority is clamped to it. */
    EXPECT_EQ(p_cuStreamCreateWithPriority(&clamped, 0, -100), CUDA_SUCCESS);
    EXPECT_EQ(p_cuStreamGetPriority(clamped, &priority), CUDA_SUCCESS);
    EXPECT_EQ(priority, -5);
    EXPECT_EQ(p_cuStreamCreate(&low, 0), CUDA_SUCCESS);
    EXPECT_EQ(p_cuStreamGetPriority(low, &priority), CUDA_SUCCESS);
    EXPECT_EQ(priority, 0);
    EXPECT_EQ(p_cuStreamGetFlags(low, &flags), CUDA_SUCCESS);
    EXPECT_EQ(flags, 0);
    /* The default streams have the least priority. */
    EXPECT_EQ(p_cuStreamGetPriority(NULL, &priority), CUDA_SUCCESS);
    EXPECT_EQ(priority, 0);
    EXPECT_EQ(p_cuStreamGetPriority_ptsz(NULL, &priority), CUDA_SUCCESS);
    EXPECT_EQ(priority, 0);
    /* Ids are stable and unique, the default streams' included. */
    EXPECT_EQ(p_cuStreamGetId(high, &id1), CUDA_SUCCESS);
    EXPECT_EQ(p_cuStreamGetId(low, &id2), CUDA_SUCCESS);
    EXPECT_EQ(p_cuStreamGetId(high, &again), CUDA_SUCCESS);
    EXPECT_EQ(p_cuStreamGetId(CU_STREAM_LEGACY, &legacy), CUDA_SUCCESS);
    EXPECT_EQ(p_cuStreamGetId_ptsz(NULL, &per_thread), CUDA_SUCCESS);
    EXPECT_EQ(again, id1);
    EXPECT_TRUE(id1 != id2 && legacy != per_thread && legacy != id1 && legacy != id2 &&
                per_thread != id1 && per_thread != id2);
    EXPECT_EQ(p_cuStreamGetPriority(NULL, NULL), CUDA_ERROR_INVALID_VALUE);
    CUdevice dev = -1;
    EXPECT_EQ(p_cuStreamGetDevice(high, &dev), CUDA_SUCCESS);
    EXPECT_EQ(dev, 0);
    EXPECT_EQ(p_cuStreamGetDevice(high, NULL), CUDA_ERROR_INVALID_VALUE);
    EXPECT_EQ(p_cuStreamDestroy_v2(high), CUDA_SUCCESS);
    EXPECT_EQ(p_cuStreamDestroy_v2(low), CUDA_SUCCESS);
    EXPECT_EQ(p_cuStreamDestroy_v2(clamped), CUDA_SUCCESS);

    /* Context ids: stable, distinct per context; NULL means the current context. */
    CUcontext primary = NULL, other = NULL;
    unsigned long long a = 0, b = 0, current = 0;
    EXPECT_EQ(p_cuDevicePrimaryCtxRetain(&primary, 0), CUDA_SUCCESS);
    EXPECT_EQ(p_cuCtxCreate_v2(&other, 0, 0), CUDA_SUCCESS);
    EXPECT_EQ(p_cuCtxGetId(primary, &a), CUDA_SUCCESS);
    EXPECT_EQ(p_cuCtxGetId(other, &b), CUDA_SUCCESS);
    EXPECT_EQ(p_cuCtxGetId(NULL, &current), CUDA_SUCCESS); /* cuCtxCreate made `other` current */
    EXPECT_TRUE(a != 0 && b != 0 && a != b);
    EXPECT_EQ(current, b);
    EXPECT_EQ(p_cuCtxDestroy_v2(other), CUDA_SUCCESS);
    EXPECT_EQ(p_cuCtxGetId(other, &b), CUDA_ERROR_INVALID_CONTEXT);
    EXPECT_EQ(p_cuCtxSetCurrent(primary), CUDA_SUCCESS);
}

/* Time between two events around `launch` on stream s, in ms. */
static float timed(CUstream s, CUresult (*launch)(CUstream, void *), void *arg)
{
    LOAD(lib, cuEventCreate);
    LOAD(lib, cuEventRecord);
    LOAD(lib, cuEventSynchronize);
    LOAD(lib, cuEventElapsedTime);
    LOAD(lib, cuEventDestroy_v2);
    CUevent start = NULL, end = NULL;
    float ms = -1;
    EXPECT_EQ(p_cuEventCreate(&start, 0), CUDA_SUCCESS);
    EXPECT_EQ(p_cuEventCreate(&end, 0), CUDA_SUCCESS);
    EXPECT_EQ(p_cuEventRecord(start, s), CUDA_SUCCESS);
    EXPECT_EQ(launch(s, arg), CUDA_SUCCESS);
    EXPECT_EQ(p_cuEventRecord(end, s), CUDA_SUCCESS);
    EXPECT_EQ(p_cuEventSynchronize(end), CUDA_SUCCESS);
    EXPECT_EQ(p_cuEventElapsedTime(&ms, start, end), CUDA_SUCCESS);
    p_cuEventDestroy_v2(start);
    p_cuEventDestroy_v2(end);
    return ms;
}

static uint64_t sleep_ns = 20 * 1000000ULL;

static CUresult launch_plain(CUstream s, void *handle)
{
    LOAD(lib, cuLaunchKernel);
    void *params[] = {&sleep_ns};
    return p_cuLaunchKernel((CUfunction)handle, 1, 1, 1, 32, 1, 1, 0, s, params, NULL);
}

static CUresult launch_ex(CUstream s, void *handle)
{
    LOAD(lib, cuLaunchKernelEx);
    void *params[] = {&sleep_ns};
    CUlaunchConfig config = {1, 1, 1, 32, 1, 1, 0, s, NULL, 0};
    return p_cuLaunchKernelEx(&config, (CUfunction)handle, params, NULL);
}

static void libraries(void)
{
    LOAD(lib, cuLibraryLoadData);
    LOAD(lib, cuLibraryLoadFromFile);
    LOAD(lib, cuLibraryUnload);
    LOAD(lib, cuLibraryGetKernel);
    LOAD(lib, cuLibraryGetKernelCount);
    LOAD(lib, cuLibraryEnumerateKernels);
    LOAD(lib, cuLibraryGetModule);
    LOAD(lib, cuKernelGetFunction);
    LOAD(lib, cuKernelGetName);
    LOAD(lib, cuKernelGetAttribute);
    LOAD(lib, cuKernelSetAttribute);
    LOAD(lib, cuKernelSetCacheConfig);
    LOAD(lib, cuFuncSetCacheConfig);
    LOAD(lib, cuFuncGetName);
    LOAD(lib, cuFuncGetModule);
    LOAD(lib, cuFuncGetAttribute);
    LOAD(lib, cuCtxCreate_v2);
    LOAD(lib, cuCtxDestroy_v2);
    LOAD(lib, cuCtxSetCurrent);
    LOAD(lib, cuCtxGetCurrent);
    LOAD(lib, cuStreamCreate);
    LOAD(lib, cuStreamDestroy_v2);
    CUlibrary library = NULL, from_file = NULL, wrong_arch = NULL;
    CUkernel kernel = NULL, same = NULL, listed = NULL, missing = NULL;
    CUfunction f = NULL, f_other = NULL;
    CUmodule module = NULL, of_function = NULL;
    const char *name = NULL;
    unsigned int count = 0;
    int value = 0;
    EXPECT_EQ(p_cuLibraryLoadData(&library, sleep_kernel_ptx, NULL, NULL, 0, NULL, NULL, 0),
              CUDA_SUCCESS);
    EXPECT_EQ(p_cuLibraryGetKernel(&kernel, library, "simgpu_sleep_ns"), CUDA_SUCCESS);
    EXPECT_EQ(p_cuLibraryGetKernel(&same, library, "simgpu_sleep_ns"), CUDA_SUCCESS);
    EXPECT_TRUE(kernel == same);
    EXPECT_EQ(p_cuLibraryGetKernel(&missing, library, "no_such_kernel"), CUDA_ERROR_NOT_FOUND);
    EXPECT_EQ(p_cuLibraryGetKernelCount(&count, library), CUDA_SUCCESS);
    EXPECT_EQ(count, 1);
    EXPECT_EQ(p_cuLibraryEnumerateKernels(&listed, 1, library), CUDA_SUCCESS);
    EXPECT_TRUE(listed == kernel);
    EXPECT_EQ(p_cuKernelGetName(&name, kernel), CUDA_SUCCESS);
    EXPECT_TRUE(name != NULL && strcmp(name, "simgpu_sleep_ns") == 0);

    /* The kernel's function in the current context belongs to the library's module there. */
    EXPECT_EQ(p_cuKernelGetFunction(&f, kernel), CUDA_SUCCESS);
    EXPECT_EQ(p_cuFuncGetName(&name, f), CUDA_SUCCESS);
    EXPECT_TRUE(name != NULL && strcmp(name, "simgpu_sleep_ns") == 0);
    EXPECT_EQ(p_cuLibraryGetModule(&module, library), CUDA_SUCCESS);
    EXPECT_EQ(p_cuFuncGetModule(&of_function, f), CUDA_SUCCESS);
    EXPECT_TRUE(module != NULL && module == of_function);

    /* A kernel's attributes, set through the kernel, are its functions'. */
    EXPECT_EQ(p_cuKernelGetAttribute(&value, CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK, kernel, 0),
              CUDA_SUCCESS);
    EXPECT_TRUE(value >= 32 && value <= 1024);
    EXPECT_EQ(p_cuKernelSetAttribute(CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, 65536,
                                     kernel, 0),
              CUDA_SUCCESS);
    EXPECT_EQ(p_cuFuncGetAttribute(&value, CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, f),
              CUDA_SUCCESS);
    EXPECT_EQ(value, 65536);
    EXPECT_EQ(p_cuKernelGetAttribute(&value, CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                                     kernel, 0),
              CUDA_SUCCESS);
    EXPECT_EQ(value, 65536);
    /* The function APIs take the kernel itself too (CUDA 12). */
    EXPECT_EQ(p_cuFuncGetAttribute(&value, CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                                   (CUfunction)kernel),
              CUDA_SUCCESS);
    EXPECT_EQ(value, 65536);
    EXPECT_EQ(p_cuKernelGetAttribute(&value, CU_FUNC_ATTRIBUTE_NUM_REGS, kernel, 999),
              CUDA_ERROR_INVALID_DEVICE);
    /* Cache preferences: CU_FUNC_CACHE_PREFER_NONE (0) to PREFER_EQUAL (3). */
    EXPECT_EQ(p_cuKernelSetCacheConfig(kernel, 1, 0), CUDA_SUCCESS);
    EXPECT_EQ(p_cuKernelSetCacheConfig(kernel, 9, 0), CUDA_ERROR_INVALID_VALUE);
    EXPECT_EQ(p_cuKernelSetCacheConfig(kernel, 1, 999), CUDA_ERROR_INVALID_DEVICE);
    EXPECT_EQ(p_cuFuncSetCacheConfig(f, 3), CUDA_SUCCESS);
    EXPECT_EQ(p_cuFuncSetCacheConfig(f, -1), CUDA_ERROR_INVALID_VALUE);

    /* A CUkernel launches like its function and occupies the GPU for the kernel's time. */
    CUstream s = NULL;
    EXPECT_EQ(p_cuStreamCreate(&s, 0), CUDA_SUCCESS);
    EXPECT_TRUE(timed(s, launch_plain, kernel) >= 20.0f);
    EXPECT_TRUE(timed(s, launch_ex, kernel) >= 20.0f);
    EXPECT_TRUE(timed(s, launch_plain, f) >= 20.0f);

    /* In another context the same kernel is another function, loaded there on first use. */
    CUcontext primary = NULL, other = NULL;
    EXPECT_EQ(p_cuCtxGetCurrent(&primary), CUDA_SUCCESS);
    EXPECT_EQ(p_cuCtxCreate_v2(&other, 0, 0), CUDA_SUCCESS);
    EXPECT_EQ(p_cuKernelGetFunction(&f_other, kernel), CUDA_SUCCESS);
    EXPECT_TRUE(f_other != NULL && f_other != f);
    EXPECT_EQ(launch_plain(NULL, kernel), CUDA_SUCCESS);
    EXPECT_EQ(p_cuCtxDestroy_v2(other), CUDA_SUCCESS);
    EXPECT_EQ(p_cuCtxSetCurrent(primary), CUDA_SUCCESS);

    /* Files: a cubin for the device's architecture loads, one for another does not. */
    char path[4096];
    snprintf(path, sizeof path, "%s/simgpu_sleep_sm90.cubin", image_dir);
    EXPECT_EQ(p_cuLibraryLoadFromFile(&from_file, path, NULL, NULL, 0, NULL, NULL, 0),
              CUDA_SUCCESS);
    EXPECT_EQ(p_cuLibraryGetKernel(&kernel, from_file, "simgpu_sleep_ns"), CUDA_SUCCESS);
    EXPECT_TRUE(timed(s, launch_plain, kernel) >= 20.0f);
    snprintf(path, sizeof path, "%s/simgpu_sleep_sm80.cubin", image_dir);
    EXPECT_EQ(p_cuLibraryLoadFromFile(&wrong_arch, path, NULL, NULL, 0, NULL, NULL, 0),
              CUDA_ERROR_NO_BINARY_FOR_GPU);
    snprintf(path, sizeof path, "%s/no_such_file.cubin", image_dir);
    EXPECT_EQ(p_cuLibraryLoadFromFile(&wrong_arch, path, NULL, NULL, 0, NULL, NULL, 0),
              CUDA_ERROR_FILE_NOT_FOUND);

    EXPECT_EQ(p_cuStreamDestroy_v2(s), CUDA_SUCCESS);
    EXPECT_EQ(p_cuLibraryUnload(from_file), CUDA_SUCCESS);
    EXPECT_EQ(p_cuLibraryUnload(library), CUDA_SUCCESS);
}

/* Load an image from memory and look up one defined and one undefined name. */
static void expect_image(const void *image, CUresult load, const char *what)
{
    LOAD(lib, cuModuleLoadData);
    LOAD(lib, cuModuleGetFunction);
    LOAD(lib, cuModuleUnload);
    CUmodule m = NULL;
    CUfunction f = NULL;
    CUresult rc = p_cuModuleLoadData(&m, image);
    if (rc != load)
        fprintf(stderr, "image: %s\n", what);
    EXPECT_EQ(rc, load);
    if (rc != CUDA_SUCCESS)
        return;
    EXPECT_EQ(p_cuModuleGetFunction(&f, m, "simgpu_sleep_ns"), CUDA_SUCCESS);
    EXPECT_EQ(p_cuModuleGetFunction(&f, m, "no_such_kernel"), CUDA_ERROR_NOT_FOUND);
    EXPECT_EQ(p_cuModuleUnload(m), CUDA_SUCCESS);
}

static void images(void)
{
    LOAD(lib, cuModuleLoad);
    LOAD(lib, cuModuleLoadFatBinary);
    LOAD(lib, cuModuleGetFunction);
    LOAD(lib, cuModuleUnload);
    size_t sm90_size = 0, sm80_size = 0;
    char *sm90 = test_read_file(image_dir, "simgpu_sleep_sm90.cubin", &sm90_size);
    char *sm80 = test_read_file(image_dir, "simgpu_sleep_sm80.cubin", &sm80_size);
    expect_image(sleep_kernel_ptx, CUDA_SUCCESS, "PTX");
    expect_image(sm90, CUDA_SUCCESS, "sm_90 cubin");
    expect_image(sm80, CUDA_ERROR_NO_BINARY_FOR_GPU, "sm_80 cubin");

    /* A fatbin: the cubin for the device is chosen, else PTX it can compile, else nothing. */
    const struct fat_entry cubin90 = {2, 90, sm90, sm90_size};
    const struct fat_entry cubin80 = {2, 80, sm80, sm80_size};
    const struct fat_entry ptx70 = {1, 70, sleep_kernel_ptx, sizeof sleep_kernel_ptx};
    const struct fat_entry both[] = {cubin80, cubin90}, fallback[] = {cubin80, ptx70},
                           none[] = {cubin80};
    unsigned char *fb_both = make_fatbin(both, 2), *fb_fallback = make_fatbin(fallback, 2),
                  *fb_none = make_fatbin(none, 1);
    expect_image(fb_both, CUDA_SUCCESS, "fatbin with sm_80 and sm_90 cubins");
    expect_image(fb_fallback, CUDA_SUCCESS, "fatbin with an sm_80 cubin and PTX");
    expect_image(fb_none, CUDA_ERROR_NO_BINARY_FOR_GPU, "fatbin with an sm_80 cubin only");
    CUmodule m = NULL;
    CUfunction f = NULL;
    EXPECT_EQ(p_cuModuleLoadFatBinary(&m, fb_both), CUDA_SUCCESS);
    EXPECT_EQ(p_cuModuleGetFunction(&f, m, "simgpu_sleep_ns"), CUDA_SUCCESS);
    EXPECT_EQ(p_cuModuleUnload(m), CUDA_SUCCESS);

    /* Files: PTX without a terminating NUL loads; a truncated cubin is an invalid image. */
    EXPECT_EQ(p_cuModuleLoad(&m, temp_file(sleep_kernel_ptx, strlen(sleep_kernel_ptx))),
              CUDA_SUCCESS);
    EXPECT_EQ(p_cuModuleGetFunction(&f, m, "simgpu_sleep_ns"), CUDA_SUCCESS);
    EXPECT_EQ(p_cuModuleGetFunction(&f, m, "no_such_kernel"), CUDA_ERROR_NOT_FOUND);
    EXPECT_EQ(p_cuModuleUnload(m), CUDA_SUCCESS);
    const char *truncated = temp_file(sm90, sm90_size / 2);
    EXPECT_EQ(p_cuModuleLoad(&m, truncated), CUDA_ERROR_INVALID_IMAGE);
    unlink(truncated);
    free(fb_both);
    free(fb_fallback);
    free(fb_none);
    free(sm90);
    free(sm80);
}

static void pointers(void)
{
    LOAD(lib, cuPointerGetAttribute);
    LOAD(lib, cuPointerGetAttributes);
    LOAD(lib, cuMemAlloc_v2);
    LOAD(lib, cuMemFree_v2);
    LOAD(lib, cuMemAllocManaged);
    LOAD(lib, cuMemAllocHost_v2);
    LOAD(lib, cuMemFreeHost);
    LOAD(lib, cuMemAllocAsync);
    LOAD(lib, cuMemFreeAsync);
    LOAD(lib, cuDeviceGetDefaultMemPool);
    LOAD(lib, cuCtxGetCurrent);
    LOAD(lib, cuCtxSynchronize);
    CUcontext ctx = NULL, owner = NULL;
    CUdeviceptr a = 0, b = 0, managed = 0, pooled = 0, start = 0;
    void *host = NULL, *host_ptr = NULL;
    unsigned int type = 0;
    int ordinal = -1, flag = 0;
    size_t size = 0;
    unsigned long long id_a = 0, id_b = 0;
    CUmemoryPool pool = NULL, default_pool = NULL;
    EXPECT_EQ(p_cuCtxGetCurrent(&ctx), CUDA_SUCCESS);
    EXPECT_EQ(p_cuMemAlloc_v2(&a, 1000), CUDA_SUCCESS);
    EXPECT_EQ(p_cuMemAlloc_v2(&b, 4096), CUDA_SUCCESS);
    EXPECT_EQ(p_cuPointerGetAttribute(&type, CU_POINTER_ATTRIBUTE_MEMORY_TYPE, a + 10),
              CUDA_SUCCESS);
    EXPECT_EQ(type, CU_MEMORYTYPE_DEVICE);
    EXPECT_EQ(p_cuPointerGetAttribute(&owner, CU_POINTER_ATTRIBUTE_CONTEXT, a), CUDA_SUCCESS);
    EXPECT_TRUE(owner == ctx);
    EXPECT_EQ(p_cuPointerGetAttribute(&ordinal, CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL, a),
              CUDA_SUCCESS);
    EXPECT_EQ(ordinal, 0);
    EXPECT_EQ(p_cuPointerGetAttribute(&start, CU_POINTER_ATTRIBUTE_RANGE_START_ADDR, a + 10),
              CUDA_SUCCESS);
    EXPECT_EQ(start, a);
    EXPECT_EQ(p_cuPointerGetAttribute(&size, CU_POINTER_ATTRIBUTE_RANGE_SIZE, a + 10),
              CUDA_SUCCESS);
    EXPECT_TRUE(size >= 1000);
    EXPECT_EQ(p_cuPointerGetAttribute(&flag, CU_POINTER_ATTRIBUTE_IS_MANAGED, a), CUDA_SUCCESS);
    EXPECT_EQ(flag, 0);
    EXPECT_EQ(p_cuPointerGetAttribute(&flag, CU_POINTER_ATTRIBUTE_MAPPED, a), CUDA_SUCCESS);
    EXPECT_EQ(flag, 1);
    flag = 0;
    EXPECT_EQ(p_cuPointerGetAttribute(&flag, CU_POINTER_ATTRIBUTE_IS_LEGACY_CUDA_IPC_CAPABLE, a),
              CUDA_SUCCESS);
    EXPECT_EQ(flag, 1);
    EXPECT_EQ(p_cuPointerGetAttribute(&host_ptr, CU_POINTER_ATTRIBUTE_HOST_POINTER, a),
              CUDA_ERROR_INVALID_VALUE); /* device memory has no host address */
    EXPECT_EQ(p_cuPointerGetAttribute(&id_a, CU_POINTER_ATTRIBUTE_BUFFER_ID, a), CUDA_SUCCESS);
    EXPECT_EQ(p_cuPointerGetAttribute(&id_b, CU_POINTER_ATTRIBUTE_BUFFER_ID, b), CUDA_SUCCESS);
    EXPECT_TRUE(id_a != 0 && id_b != 0 && id_a != id_b);

    /* Managed memory is device memory the host may dereference; pinned host memory is host
     * memory. */
    EXPECT_EQ(p_cuMemAllocManaged(&managed, 4096, CU_MEM_ATTACH_GLOBAL), CUDA_SUCCESS);
    flag = 0;
    EXPECT_EQ(p_cuPointerGetAttribute(&flag, CU_POINTER_ATTRIBUTE_IS_MANAGED, managed),
              CUDA_SUCCESS);
    EXPECT_EQ(flag, 1);
    EXPECT_EQ(p_cuPointerGetAttribute(&host_ptr, CU_POINTER_ATTRIBUTE_HOST_POINTER, managed),
              CUDA_SUCCESS);
    EXPECT_TRUE(host_ptr == (void *)(uintptr_t)managed);
    EXPECT_EQ(p_cuMemAllocHost_v2(&host, 4096), CUDA_SUCCESS);
    EXPECT_EQ(p_cuPointerGetAttribute(&type, CU_POINTER_ATTRIBUTE_MEMORY_TYPE,
                                      (CUdeviceptr)(uintptr_t)host),
              CUDA_SUCCESS);
    EXPECT_EQ(type, CU_MEMORYTYPE_HOST);

    /* A stream-ordered allocation names its pool. */
    EXPECT_EQ(p_cuMemAllocAsync(&pooled, 4096, NULL), CUDA_SUCCESS);
    EXPECT_EQ(p_cuDeviceGetDefaultMemPool(&default_pool, 0), CUDA_SUCCESS);
    EXPECT_EQ(p_cuPointerGetAttribute(&pool, CU_POINTER_ATTRIBUTE_MEMPOOL_HANDLE, pooled),
              CUDA_SUCCESS);
    EXPECT_TRUE(pool == default_pool);

    /* Memory CUDA does not know: an error from the single query, defaults from the plural. */
    int stack_var = 0;
    CUdeviceptr unknown = (CUdeviceptr)(uintptr_t)&stack_var;
    EXPECT_EQ(p_cuPointerGetAttribute(&type, CU_POINTER_ATTRIBUTE_MEMORY_TYPE, unknown),
              CUDA_ERROR_INVALID_VALUE);
    CUpointer_attribute attrs[] = {CU_POINTER_ATTRIBUTE_MEMORY_TYPE, CU_POINTER_ATTRIBUTE_CONTEXT,
                                   CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL,
                                   CU_POINTER_ATTRIBUTE_IS_MANAGED};
    type = 99;
    owner = ctx;
    flag = 0;
    void *data[] = {&type, &owner, &ordinal, &flag};
    EXPECT_EQ(p_cuPointerGetAttributes(4, attrs, data, unknown), CUDA_SUCCESS);
    EXPECT_EQ(type, 0);
    EXPECT_TRUE(owner == NULL);
    EXPECT_EQ(ordinal, -2);
    EXPECT_EQ(flag, 0);
    EXPECT_EQ(p_cuPointerGetAttributes(4, attrs, data, b), CUDA_SUCCESS);
    EXPECT_EQ(type, CU_MEMORYTYPE_DEVICE);
    EXPECT_TRUE(owner == ctx);
    EXPECT_EQ(ordinal, 0);

    EXPECT_EQ(p_cuMemFreeAsync(pooled, NULL), CUDA_SUCCESS);
    EXPECT_EQ(p_cuCtxSynchronize(), CUDA_SUCCESS);
    EXPECT_EQ(p_cuMemFreeHost(host), CUDA_SUCCESS);
    EXPECT_EQ(p_cuMemFree_v2(managed), CUDA_SUCCESS);
    EXPECT_EQ(p_cuMemFree_v2(a), CUDA_SUCCESS);
    EXPECT_EQ(p_cuMemFree_v2(b), CUDA_SUCCESS);
    /* A freed allocation is forgotten. */
    EXPECT_EQ(p_cuPointerGetAttribute(&type, CU_POINTER_ATTRIBUTE_MEMORY_TYPE, a),
              CUDA_ERROR_INVALID_VALUE);
}

static size_t shared_per_block(int block_size)
{
    return (size_t)block_size * 64;
}

static void occupancy(void)
{
    LOAD(lib, cuModuleLoadData);
    LOAD(lib, cuModuleGetFunction);
    LOAD(lib, cuModuleUnload);
    LOAD(lib, cuDeviceGetAttribute);
    LOAD(lib, cuOccupancyMaxActiveBlocksPerMultiprocessor);
    LOAD(lib, cuOccupancyMaxActiveBlocksPerMultiprocessorWithFlags);
    LOAD(lib, cuOccupancyMaxPotentialBlockSize);
    LOAD(lib, cuOccupancyAvailableDynamicSMemPerBlock);
    CUmodule m = NULL;
    CUfunction f = NULL;
    int blocks = 0, fewer = 0, grid = 0, block = 0, sms = 0;
    size_t smem = 0;
    EXPECT_EQ(p_cuModuleLoadData(&m, sleep_kernel_ptx), CUDA_SUCCESS);
    EXPECT_EQ(p_cuModuleGetFunction(&f, m, "simgpu_sleep_ns"), CUDA_SUCCESS);
    EXPECT_EQ(p_cuDeviceGetAttribute(&sms, CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, 0),
              CUDA_SUCCESS);
    EXPECT_EQ(p_cuOccupancyMaxActiveBlocksPerMultiprocessor(&blocks, f, 128, 0), CUDA_SUCCESS);
    EXPECT_TRUE(blocks >= 1 && blocks <= 32);
    /* More shared memory per block fits fewer blocks. */
    EXPECT_EQ(p_cuOccupancyMaxActiveBlocksPerMultiprocessorWithFlags(&fewer, f, 128, 96 * 1024, 0),
              CUDA_SUCCESS);
    EXPECT_TRUE(fewer >= 1 && fewer < blocks);
    EXPECT_EQ(p_cuOccupancyMaxActiveBlocksPerMultiprocessor(&blocks, f, 0, 0),
              CUDA_ERROR_INVALID_VALUE);
    EXPECT_EQ(p_cuOccupancyMaxPotentialBlockSize(&grid, &block, f, NULL, 0, 0), CUDA_SUCCESS);
    EXPECT_TRUE(block >= 32 && block <= 1024 && block % 32 == 0);
    EXPECT_TRUE(grid >= sms && grid % sms == 0);
    EXPECT_EQ(p_cuOccupancyMaxPotentialBlockSize(&grid, &block, f, shared_per_block, 0, 256),
              CUDA_SUCCESS);
    EXPECT_TRUE(block >= 32 && block <= 256);
    EXPECT_EQ(p_cuOccupancyAvailableDynamicSMemPerBlock(&smem, f, 1, 128), CUDA_SUCCESS);
    EXPECT_TRUE(smem >= 48 * 1024);
    EXPECT_EQ(p_cuModuleUnload(m), CUDA_SUCCESS);
}

/* cuda-python resolves each entry point at the CUDA version that introduced it (its
 * cuda/bindings/_internal/driver.pyx): each must resolve at that version. */
/* A kernel with parameters of several sizes and alignments, in PTX. */
static const char params_ptx[] = ".version 7.0\n.target sm_70\n.address_size 64\n"
                                 ".visible .entry many(\n"
                                 "  .param .u64 .ptr .global .align 8 p0,\n"
                                 "  .param .u32 p1,\n"
                                 "  .param .f64 p2,\n"
                                 "  .param .u8 p3,\n"
                                 "  .param .align 16 .b8 p4[16],\n"
                                 "  .param .align 4 .b8 p5[20]\n"
                                 ")\n{\n  ret;\n}\n"
                                 ".visible .entry none()\n{\n  ret;\n}\n";

static void parameters(void)
{
    LOAD(lib, cuLibraryLoadData);
    LOAD(lib, cuLibraryLoadFromFile);
    LOAD(lib, cuLibraryUnload);
    LOAD(lib, cuLibraryGetKernel);
    LOAD(lib, cuKernelGetParamInfo);
    LOAD(lib, cuKernelGetFunction);
    LOAD(lib, cuFuncGetParamInfo);
    CUlibrary ptx = NULL, cubin = NULL;
    CUkernel many = NULL, none = NULL, sleep = NULL;
    CUfunction f = NULL;
    size_t offset = 99, size = 99;
    /* Offsets follow each parameter's alignment, as the CUDA ABI lays them out. */
    static const size_t want[][2] = {{0, 8}, {8, 4}, {16, 8}, {24, 1}, {32, 16}, {48, 20}};
    EXPECT_EQ(p_cuLibraryLoadData(&ptx, params_ptx, NULL, NULL, 0, NULL, NULL, 0), CUDA_SUCCESS);
    EXPECT_EQ(p_cuLibraryGetKernel(&many, ptx, "many"), CUDA_SUCCESS);
    EXPECT_EQ(p_cuLibraryGetKernel(&none, ptx, "none"), CUDA_SUCCESS);
    for (size_t i = 0; i < 6; i++) {
        EXPECT_EQ(p_cuKernelGetParamInfo(many, i, &offset, &size), CUDA_SUCCESS);
        EXPECT_EQ(offset, want[i][0]);
        EXPECT_EQ(size, want[i][1]);
    }
    EXPECT_EQ(p_cuKernelGetParamInfo(many, 6, &offset, &size), CUDA_ERROR_INVALID_VALUE);
    EXPECT_EQ(p_cuKernelGetParamInfo(many, 0, NULL, &size), CUDA_ERROR_INVALID_VALUE);
    EXPECT_EQ(p_cuKernelGetParamInfo(many, 1, &offset, NULL), CUDA_SUCCESS); /* size optional */
    EXPECT_EQ(p_cuKernelGetParamInfo(none, 0, &offset, &size), CUDA_ERROR_INVALID_VALUE);
    EXPECT_EQ(p_cuKernelGetFunction(&f, many), CUDA_SUCCESS);
    EXPECT_EQ(p_cuFuncGetParamInfo(f, 5, &offset, &size), CUDA_SUCCESS);
    EXPECT_EQ(offset, 48);
    EXPECT_EQ(size, 20);
    EXPECT_EQ(p_cuFuncGetParamInfo(NULL, 0, &offset, &size), CUDA_ERROR_INVALID_HANDLE);

    /* A cubin says it in the kernel's .nv.info section: one u64 at offset 0. */
    char path[4096];
    snprintf(path, sizeof path, "%s/simgpu_sleep_sm90.cubin", image_dir);
    EXPECT_EQ(p_cuLibraryLoadFromFile(&cubin, path, NULL, NULL, 0, NULL, NULL, 0), CUDA_SUCCESS);
    EXPECT_EQ(p_cuLibraryGetKernel(&sleep, cubin, "simgpu_sleep_ns"), CUDA_SUCCESS);
    EXPECT_EQ(p_cuKernelGetParamInfo(sleep, 0, &offset, &size), CUDA_SUCCESS);
    EXPECT_EQ(offset, 0);
    EXPECT_EQ(size, 8);
    EXPECT_EQ(p_cuKernelGetParamInfo(sleep, 1, &offset, &size), CUDA_ERROR_INVALID_VALUE);
    EXPECT_EQ(p_cuLibraryUnload(cubin), CUDA_SUCCESS);
    EXPECT_EQ(p_cuLibraryUnload(ptx), CUDA_SUCCESS);
}

static void proc_addresses(void)
{
    LOAD(lib, cuGetProcAddress_v2);
    static const struct {
        const char *name;
        int version;
    } wanted[] = {
        {"cuCtxGetStreamPriorityRange", 5050}, {"cuCtxGetId", 12000},
        {"cuStreamCreateWithPriority", 5050}, {"cuStreamGetPriority", 7000},
        {"cuStreamGetFlags", 7000}, {"cuStreamGetId", 12000}, {"cuStreamGetDevice", 12080},
        {"cuLibraryLoadData", 12000}, {"cuLibraryLoadFromFile", 12000},
        {"cuLibraryUnload", 12000}, {"cuLibraryGetKernel", 12000},
        {"cuLibraryGetKernelCount", 12040}, {"cuLibraryEnumerateKernels", 12040},
        {"cuLibraryGetModule", 12000}, {"cuKernelGetFunction", 12000},
        {"cuKernelGetLibrary", 12050}, {"cuKernelGetName", 12030},
        {"cuKernelGetAttribute", 12000}, {"cuKernelSetAttribute", 12000},
        {"cuKernelSetCacheConfig", 12000}, {"cuFuncGetName", 12030}, {"cuFuncGetModule", 11000},
        {"cuFuncSetCacheConfig", 3000}, {"cuModuleLoadFatBinary", 2000},
        {"cuOccupancyMaxActiveBlocksPerMultiprocessor", 6050},
        {"cuOccupancyMaxActiveBlocksPerMultiprocessorWithFlags", 7000},
        {"cuOccupancyMaxPotentialBlockSize", 6050},
        {"cuOccupancyMaxPotentialBlockSizeWithFlags", 7000},
        {"cuOccupancyAvailableDynamicSMemPerBlock", 10020}, {"cuPointerGetAttribute", 4000},
        {"cuPointerGetAttributes", 7000}, {"cuFuncGetParamInfo", 12040},
        {"cuKernelGetParamInfo", 12040},
    };
    for (size_t i = 0; i < sizeof wanted / sizeof wanted[0]; i++) {
        void *fn = NULL;
        CUdriverProcAddressQueryResult status = CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND;
        CUresult rc = p_cuGetProcAddress_v2(wanted[i].name, &fn, wanted[i].version, 0, &status);
        if (rc != CUDA_SUCCESS || fn == NULL)
            fprintf(stderr, "%s at %d does not resolve\n", wanted[i].name, wanted[i].version);
        EXPECT_EQ(rc, CUDA_SUCCESS);
        EXPECT_EQ(status, CU_GET_PROC_ADDRESS_SUCCESS);
    }
}

int main(int argc, char **argv)
{
    setvbuf(stdout, NULL, _IOLBF, 0);
    if (argc != 2) {
        fprintf(stderr, "usage: launch_api IMAGE_DIR\n");
        return 2;
    }
    image_dir = argv[1];
    lib = test_open("TEST_LIBCUDA", "libcuda.so.1");
    test_use_device0(lib);
    streams();
    libraries();
    images();
    pointers();
    occupancy();
    parameters();
    proc_addresses();
    if (test_failures > 0) {
        printf("FAIL %d\n", test_failures);
        return 1;
    }
    printf("PASS\n");
    return 0;
}
