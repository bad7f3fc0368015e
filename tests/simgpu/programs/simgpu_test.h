/*
 * Shared helpers for the simgpu test programs. The programs reach the driver the way real
 * applications do - dlopen("libcuda.so.1") / dlopen("libnvidia-ml.so.1") and dlsym - so the same
 * binaries run against the simulated libraries (LD_LIBRARY_PATH=build/simgpu) and against
 * NVIDIA's on a machine with a GPU. $TEST_LIBCUDA / $TEST_LIBNVML name another library file.
 */
#ifndef SIMGPU_TEST_H
#define SIMGPU_TEST_H

#include <dlfcn.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cuda_driver_abi.h"
#include "nvml_abi.h"

static inline void *test_open(const char *env, const char *soname)
{
    const char *path = getenv(env);
    void *lib = dlopen(path != NULL && path[0] != '\0' ? path : soname, RTLD_NOW | RTLD_LOCAL);
    if (lib == NULL) {
        fprintf(stderr, "cannot load %s: %s\n", soname, dlerror());
        exit(2);
    }
    return lib;
}

static inline void *test_sym(void *lib, const char *name)
{
    void *p = dlsym(lib, name);
    if (p == NULL) {
        fprintf(stderr, "missing symbol %s\n", name);
        exit(2);
    }
    return p;
}

/* Declare a pointer named like the API function, typed from the header, resolved by dlsym. */
#define LOAD(lib, fn) __typeof__(&fn) p_##fn = (__typeof__(&fn))test_sym(lib, #fn)

static int test_failures __attribute__((unused)); /* for EXPECT_* in the conformance programs */

#define EXPECT_EQ(got, want)                                                                      \
    do {                                                                                          \
        long long g_ = (long long)(got), w_ = (long long)(want);                                  \
        if (g_ != w_) {                                                                           \
            fprintf(stderr, "%s:%d: %s = %lld, expected %s = %lld\n", __FILE__, __LINE__, #got,  \
                    g_, #want, w_);                                                               \
            test_failures++;                                                                      \
        }                                                                                         \
    } while (0)

#define EXPECT_TRUE(cond) EXPECT_EQ(!!(cond), 1)

/*
 * Checks on elapsed time hold on a machine with every core busy: a bound is one the host clock
 * proves whatever the scheduler does (work that takes D cannot end sooner than D after a moment
 * read before it was queued; what happened between two host clock readings lies between them),
 * never a guess of how long something should take. A check that needs the calling thread to
 * have run without a pause (a query "while the kernel still runs") is judged by the host clock
 * after it; when the thread was descheduled past the point that makes it conclusive, the check
 * is retried where that is cheap, and otherwise counted here and reported on stderr, not failed.
 */
static int test_unchecked __attribute__((unused));

static inline uint64_t test_now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ULL + (uint64_t)ts.tv_nsec;
}

/*
 * A real kernel that spins on the GPU's global timer for `ns` nanoseconds, so a test program
 * keeps a real GPU busy for exactly as long as it keeps the simulated one busy (where the
 * [kernels] section maps simgpu_sleep_ns to param0).
 */
static const char sleep_kernel_ptx[] =
    ".version 7.0\n"
    ".target sm_70\n"
    ".address_size 64\n"
    ".visible .entry simgpu_sleep_ns(.param .u64 ns)\n"
    "{\n"
    "  .reg .pred %p;\n"
    "  .reg .b64 %d<5>;\n"
    "  ld.param.u64 %d1, [ns];\n"
    "  mov.u64 %d2, %globaltimer;\n"
    "  add.u64 %d3, %d2, %d1;\n"
    "WAIT:\n"
    "  mov.u64 %d4, %globaltimer;\n"
    "  setp.lt.u64 %p, %d4, %d3;\n"
    "  @%p bra WAIT;\n"
    "  ret;\n"
    "}\n";

/* The whole file dir/name, with a NUL after it (the image test programs' cubins); exits with 2
 * if it cannot be read. */
static inline char *test_read_file(const char *dir, const char *name, size_t *size)
{
    char path[4096];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    FILE *f = fopen(path, "rb");
    long len = f != NULL && fseek(f, 0, SEEK_END) == 0 ? ftell(f) : -1;
    char *data = len >= 0 ? (char *)calloc(1, (size_t)len + 1) : NULL;
    if (data == NULL || fseek(f, 0, SEEK_SET) != 0 ||
        fread(data, 1, (size_t)len, f) != (size_t)len) {
        fprintf(stderr, "cannot read %s\n", path);
        exit(2);
    }
    fclose(f);
    *size = (size_t)len;
    return data;
}

/* cuInit and device 0's primary context made current, for the programs that test what comes
 * after; exits with 2 (no device) if that fails. */
static inline void test_use_device0(void *lib)
{
    LOAD(lib, cuInit);
    LOAD(lib, cuDevicePrimaryCtxRetain);
    LOAD(lib, cuCtxSetCurrent);
    CUcontext ctx = NULL;
    if (p_cuInit(0) != CUDA_SUCCESS || p_cuDevicePrimaryCtxRetain(&ctx, 0) != CUDA_SUCCESS ||
        p_cuCtxSetCurrent(ctx) != CUDA_SUCCESS) {
        fprintf(stderr, "no device\n");
        exit(2);
    }
}

static inline void test_report_unchecked(void)
{
    if (test_unchecked > 0)
        fprintf(stderr, "%d timing-dependent checks not made: the thread was descheduled\n",
                test_unchecked);
}

#endif
