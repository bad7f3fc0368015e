/*
 * Workload probes the pytest suite drives as separate processes (several at once for the
 * cross-process tests). Each prints machine-readable lines on stdout.
 *
 *   simgpu_probe alloc DEVICE CHUNK_BYTES COUNT
 *       allocate COUNT chunks, print "alloc I RESULT" for each, then "holding", and keep the
 *       memory until stdin closes (or the process is killed).
 *   simgpu_probe duty DEVICE PERCENT PERIOD_MS DURATION_MS
 *       keep the GPU busy PERCENT % of each period with simgpu_sleep_ns kernels; print each
 *       kernel's device interval "interval START_NS END_NS" (CLOCK_MONOTONIC, from CUDA events)
 *       and "done".
 *   simgpu_probe wait-lost DEVICE
 *       work until the GPU stops answering; print "lost ALLOC_RESULT SYNC_RESULT".
 *   simgpu_probe latency ITERATIONS
 *       print "mean_ns N", the mean duration of cuDeviceGetCount.
 *   simgpu_probe call-cost ITERATIONS
 *       print "ctx_get_current_ns N" and "launch_ns N", the mean duration of cuCtxGetCurrent
 *       and of launching a zero-length simgpu_sleep_ns kernel (the per-call overhead).
 */
#include <unistd.h>

#include "simgpu_test.h"

static void *cuda;

#define CHECK(call)                                                                               \
    do {                                                                                          \
        CUresult rc_ = (call);                                                                    \
        if (rc_ != CUDA_SUCCESS) {                                                                \
            fprintf(stderr, "%s failed: %d\n", #call, (int)rc_);                                  \
            exit(1);                                                                              \
        }                                                                                         \
    } while (0)

static CUcontext use_device(int ordinal)
{
    LOAD(cuda, cuInit);
    LOAD(cuda, cuDeviceGet);
    LOAD(cuda, cuDevicePrimaryCtxRetain);
    LOAD(cuda, cuCtxSetCurrent);
    CUdevice dev = 0;
    CUcontext ctx = NULL;
    CHECK(p_cuInit(0));
    CHECK(p_cuDeviceGet(&dev, ordinal));
    CHECK(p_cuDevicePrimaryCtxRetain(&ctx, dev));
    CHECK(p_cuCtxSetCurrent(ctx));
    return ctx;
}

static int alloc_hold(int device, size_t chunk, int count)
{
    LOAD(cuda, cuMemAlloc_v2);
    LOAD(cuda, cuMemFree_v2);
    use_device(device);
    CUdeviceptr *ptrs = calloc((size_t)count, sizeof *ptrs);
    for (int i = 0; i < count; i++) {
        CUresult rc = p_cuMemAlloc_v2(&ptrs[i], chunk);
        printf("alloc %d %d\n", i, (int)rc);
        if (rc != CUDA_SUCCESS)
            ptrs[i] = 0;
    }
    printf("holding\n");
    fflush(stdout);
    while (getchar() != EOF) {
    }
    for (int i = 0; i < count; i++) {
        if (ptrs[i] != 0)
            CHECK(p_cuMemFree_v2(ptrs[i]));
    }
    free(ptrs);
    return 0;
}

static void sleep_until_ns(uint64_t t)
{
    struct timespec ts = {.tv_sec = (time_t)(t / 1000000000ULL),
                          .tv_nsec = (long)(t % 1000000000ULL)};
    while (clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &ts, NULL) != 0) {
    }
}

static int duty(int device, int percent, int period_ms, int duration_ms)
{
    LOAD(cuda, cuModuleLoadData);
    LOAD(cuda, cuModuleGetFunction);
    LOAD(cuda, cuLaunchKernel);
    LOAD(cuda, cuEventCreate);
    LOAD(cuda, cuEventRecord);
    LOAD(cuda, cuEventElapsedTime);
    LOAD(cuda, cuCtxSynchronize);
    use_device(device);
    CUmodule module = NULL;
    CUfunction sleep_fn = NULL;
    CHECK(p_cuModuleLoadData(&module, sleep_kernel_ptx));
    CHECK(p_cuModuleGetFunction(&sleep_fn, module, "simgpu_sleep_ns"));
    uint64_t period = (uint64_t)period_ms * 1000000ULL;
    uint64_t busy = period * (uint64_t)percent / 100;
    int kernels = duration_ms / period_ms;
    /* At 100 % each kernel is queued half a period early so the GPU never idles between. */
    uint64_t lead = percent >= 100 ? period / 2 : 0;
    CUevent origin = NULL;
    CUevent *starts = calloc((size_t)kernels, sizeof *starts);
    CUevent *ends = calloc((size_t)kernels, sizeof *ends);
    CHECK(p_cuEventCreate(&origin, CU_EVENT_DEFAULT));
    for (int k = 0; k < kernels; k++) {
        CHECK(p_cuEventCreate(&starts[k], CU_EVENT_DEFAULT));
        CHECK(p_cuEventCreate(&ends[k], CU_EVENT_DEFAULT));
    }
    uint64_t t0 = test_now_ns();
    CHECK(p_cuEventRecord(origin, NULL));
    for (int k = 0; k < kernels; k++) {
        uint64_t at = t0 + (uint64_t)k * period;
        sleep_until_ns(k > 0 ? at - lead : at);
        void *params[] = {&busy};
        CHECK(p_cuEventRecord(starts[k], NULL));
        CHECK(p_cuLaunchKernel(sleep_fn, 1, 1, 1, 1, 1, 1, 0, NULL, params, NULL));
        CHECK(p_cuEventRecord(ends[k], NULL));
    }
    CHECK(p_cuCtxSynchronize());
    for (int k = 0; k < kernels; k++) {
        float s = 0, e = 0;
        CHECK(p_cuEventElapsedTime(&s, origin, starts[k]));
        CHECK(p_cuEventElapsedTime(&e, origin, ends[k]));
        printf("interval %llu %llu\n", (unsigned long long)(t0 + (uint64_t)((double)s * 1e6)),
               (unsigned long long)(t0 + (uint64_t)((double)e * 1e6)));
    }
    printf("done\n");
    return 0;
}

static int wait_lost(int device)
{
    LOAD(cuda, cuMemAlloc_v2);
    LOAD(cuda, cuMemFree_v2);
    LOAD(cuda, cuCtxSynchronize);
    use_device(device);
    printf("ready\n");
    fflush(stdout);
    for (;;) {
        CUdeviceptr p = 0;
        CUresult alloc = p_cuMemAlloc_v2(&p, 1 << 20);
        CUresult sync = p_cuCtxSynchronize();
        if (alloc != CUDA_SUCCESS || sync != CUDA_SUCCESS) {
            printf("lost %d %d\n", (int)alloc, (int)sync);
            return 0;
        }
        CHECK(p_cuMemFree_v2(p));
        usleep(20000);
    }
}

static int latency(int iterations)
{
    LOAD(cuda, cuInit);
    LOAD(cuda, cuDeviceGetCount);
    int count = 0;
    CHECK(p_cuInit(0));
    uint64_t start = test_now_ns();
    for (int i = 0; i < iterations; i++)
        CHECK(p_cuDeviceGetCount(&count));
    printf("mean_ns %llu\n", (unsigned long long)((test_now_ns() - start) / (uint64_t)iterations));
    return 0;
}

static int call_cost(int iterations)
{
    LOAD(cuda, cuCtxGetCurrent);
    LOAD(cuda, cuModuleLoadData);
    LOAD(cuda, cuModuleGetFunction);
    LOAD(cuda, cuLaunchKernel);
    LOAD(cuda, cuCtxSynchronize);
    use_device(0);
    CUmodule module = NULL;
    CUfunction sleep_fn = NULL;
    CHECK(p_cuModuleLoadData(&module, sleep_kernel_ptx));
    CHECK(p_cuModuleGetFunction(&sleep_fn, module, "simgpu_sleep_ns"));
    CUcontext ctx = NULL;
    uint64_t start = test_now_ns();
    for (int i = 0; i < iterations; i++)
        CHECK(p_cuCtxGetCurrent(&ctx));
    printf("ctx_get_current_ns %llu\n",
           (unsigned long long)((test_now_ns() - start) / (uint64_t)iterations));
    uint64_t zero = 0;
    void *params[] = {&zero};
    start = test_now_ns();
    for (int i = 0; i < iterations; i++)
        CHECK(p_cuLaunchKernel(sleep_fn, 1, 1, 1, 1, 1, 1, 0, NULL, params, NULL));
    printf("launch_ns %llu\n",
           (unsigned long long)((test_now_ns() - start) / (uint64_t)iterations));
    CHECK(p_cuCtxSynchronize());
    return 0;
}

int main(int argc, char **argv)
{
    setvbuf(stdout, NULL, _IOLBF, 0);
    cuda = test_open("TEST_LIBCUDA", "libcuda.so.1");
    if (argc == 5 && strcmp(argv[1], "alloc") == 0)
        return alloc_hold(atoi(argv[2]), strtoull(argv[3], NULL, 0), atoi(argv[4]));
    if (argc == 6 && strcmp(argv[1], "duty") == 0)
        return duty(atoi(argv[2]), atoi(argv[3]), atoi(argv[4]), atoi(argv[5]));
    if (argc == 3 && strcmp(argv[1], "wait-lost") == 0)
        return wait_lost(atoi(argv[2]));
    if (argc == 3 && strcmp(argv[1], "latency") == 0)
        return latency(atoi(argv[2]));
    if (argc == 3 && strcmp(argv[1], "call-cost") == 0)
        return call_cost(atoi(argv[2]));
    fprintf(stderr, "usage: see the comment at the top of simgpu_probe.c\n");
    return 2;
}
