/*
 * A program linked directly against libcuda.so.1 (no dlopen), as most CUDA programs are. Under
 * the preloaded shim its calls must reach the shim's hooks; an unrelated library that defines
 * functions of the same names must still get its own from dlsym on its handle; and dlsym of
 * anything else must behave as without the shim (the shim does not replace dlsym).
 *
 *   shim_linked BYTES FAKE_LIBRARY
 */
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>

#include "cuda_driver_abi.h"

int main(int argc, char **argv)
{
    if (argc < 3)
        return 2;
    size_t bytes = strtoull(argv[1], NULL, 0);
    CUcontext ctx;
    CUdeviceptr p = 0;
    size_t free_b = 0, total = 0;
    if (cuInit(0) != CUDA_SUCCESS || cuDevicePrimaryCtxRetain(&ctx, 0) != CUDA_SUCCESS ||
        cuCtxSetCurrent(ctx) != CUDA_SUCCESS)
        return 3;
    printf("alloc_rc=%d\n", (int)cuMemAlloc_v2(&p, bytes));
    cuMemGetInfo_v2(&free_b, &total);
    printf("total=%zu used=%zu\n", total, total - free_b);

    void *fake = dlopen(argv[2], RTLD_NOW | RTLD_LOCAL);
    if (fake == NULL) {
        fprintf(stderr, "%s\n", dlerror());
        return 4;
    }
    int (*fake_alloc)(void) = (int (*)(void))dlsym(fake, "cuMemAlloc_v2");
    int (*curl)(void) = (int (*)(void))dlsym(fake, "curl_global_init");
    printf("fake_alloc=%d curl=%d\n", fake_alloc ? fake_alloc() : -1, curl ? curl() : -1);
    printf("default_is_linked=%d\n", dlsym(RTLD_DEFAULT, "cuMemAlloc_v2") == (void *)cuMemAlloc_v2);
    printf("next_malloc=%d\n", dlsym(RTLD_NEXT, "malloc") != NULL);
    printf("missing=%d\n", dlsym(RTLD_DEFAULT, "cuNoSuchFunction") == NULL);
    /* Twice the same RTLD_NEXT lookup: the answer does not change. */
    printf("next_stable=%d\n", dlsym(RTLD_NEXT, "free") == dlsym(RTLD_NEXT, "free"));
    return 0;
}
