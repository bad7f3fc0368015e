/*
 * The NVML half of the shim (libtessera-nvml.so, soname libnvidia-ml.so.1): memory info shows
 * the claim's limit as total and the claim's usage (from the usage region) as used, so
 * nvidia-smi, pynvml and frameworks that size themselves from NVML see the share, not the GPU.
 * Every other NVML entry point resolves to the real library through the DT_NEEDED alias
 * libnvidia-ml-real.so.1, exactly like the CUDA half.
 */
#include <dlfcn.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>

#include "limits_source.h"
#include "log.h"
#include "nvml_abi.h"
#include "tessera_shim.h"

#define SHIM_EXPORT __attribute__((visibility("default")))
#define NVML_REAL_ALIAS "libnvidia-ml-real.so.1"
#define INFO_REAP_INTERVAL_NS 100000000ULL

static struct {
    __typeof__(&nvmlDeviceGetMemoryInfo) get_memory;
    __typeof__(&nvmlDeviceGetMemoryInfo_v2) get_memory_v2;
    __typeof__(&nvmlDeviceGetUUID) get_uuid;
} real;

static pthread_once_t once = PTHREAD_ONCE_INIT;
static struct tessera_limits limits;
static bool limited;
static bool prepared; /* GPUs the limits file does not name are none of this container's */
static struct tessera_region_handle region = {.fd = -1, .slot = -1};
static int limit_gpu[TESSERA_MAX_GPUS];

static void stop_process(const char *why) __attribute__((noreturn));

static void stop_process(const char *why)
{
    char line[1200];
    int n = snprintf(line, sizeof line,
                     "tessera-shim[%d]: fatal: %s; stopping (GPU limits cannot be enforced)\n",
                     (int)getpid(), why);
    ssize_t w = write(2, line, n > 0 && (size_t)n < sizeof line ? (size_t)n : sizeof line - 1);
    (void)w;
    _exit(TESSERA_EXIT_BAD_LIMITS);
}

/* A forked child opens the region again: sweeping through its parent's open file description,
 * its locks would be its parent's (region.c). */
static void child_after_fork(void)
{
    if (region.map != NULL)
        tessera_region_after_fork_child(&region);
}

static void init(void)
{
    shim_log_init();
    void *lib = dlopen(NVML_REAL_ALIAS, RTLD_NOW | RTLD_NOLOAD);
    if (lib == NULL)
        stop_process("the real NVML library (" NVML_REAL_ALIAS ") is not loaded");
    real.get_memory = (__typeof__(real.get_memory))dlsym(lib, "nvmlDeviceGetMemoryInfo");
    real.get_memory_v2 = (__typeof__(real.get_memory_v2))dlsym(lib, "nvmlDeviceGetMemoryInfo_v2");
    real.get_uuid = (__typeof__(real.get_uuid))dlsym(lib, "nvmlDeviceGetUUID");
    dlclose(lib);

    struct tessera_limits_source source;
    char err[600];
    if (tessera_limits_load(&source, &limits, err, sizeof err) != 0)
        stop_process(err);
    if (source.origin == TESSERA_LIMITS_NONE)
        return;
    prepared = source.origin == TESSERA_LIMITS_PREPARED;
    const char *rpath = source.region_path;
    if (rpath == NULL)
        return; /* usage is private to each CUDA process: nothing to show */
    int opened = tessera_region_open(rpath, &region, err, sizeof err);
    tessera_limits_source_explain(&source, err, sizeof err);
    tessera_limits_source_release(&source);
    if (opened != 0)
        stop_process(err);
    pthread_atfork(NULL, NULL, child_after_fork);
    for (uint32_t i = 0; i < limits.count; i++) {
        limit_gpu[i] = tessera_region_gpu(region.map, limits.gpus[i].uuid);
        if (limit_gpu[i] < 0)
            stop_process("the usage region's GPU table is full or corrupt");
    }
    limited = true;
}

/* The limit and usage for `device`, if it has a memory limit. */
static bool claim_view(nvmlDevice_t device, uint64_t *limit, uint64_t *used)
{
    pthread_once(&once, init);
    if (!limited || real.get_uuid == NULL)
        return false;
    char uuid[96];
    if (real.get_uuid(device, uuid, sizeof uuid) != NVML_SUCCESS)
        return false;
    for (uint32_t i = 0; i < limits.count; i++) {
        if (strcasecmp(uuid, limits.gpus[i].uuid) != 0)
            continue;
        if (limits.gpus[i].memory_bytes == TESSERA_NO_MEMORY_LIMIT)
            return false;
        tessera_region_maybe_reap(&region, INFO_REAP_INTERVAL_NS);
        *limit = limits.gpus[i].memory_bytes;
        *used = tessera_region_used(region.map, limit_gpu[i]);
        return true;
    }
    if (!prepared)
        return false;
    *limit = 0; /* as the CUDA half refuses it every byte */
    *used = 0;
    return true;
}

/* total = the limit (or the GPU, if smaller), used = the claim's, free = what is left of it
 * (never negative, never more than the GPU has free). */
static void apply(unsigned long long *total, unsigned long long *free, unsigned long long *used,
                  uint64_t limit, uint64_t claim_used)
{
    uint64_t t = limit < *total ? limit : *total;
    uint64_t f = claim_used < t ? t - claim_used : 0;
    if (f > *free)
        f = *free;
    *total = t;
    *used = claim_used;
    *free = f;
}

SHIM_EXPORT nvmlReturn_t nvmlDeviceGetMemoryInfo(nvmlDevice_t device, nvmlMemory_t *memory)
{
    pthread_once(&once, init);
    if (real.get_memory == NULL)
        return NVML_ERROR_FUNCTION_NOT_FOUND;
    nvmlReturn_t rc = real.get_memory(device, memory);
    uint64_t limit = 0, used = 0;
    if (rc == NVML_SUCCESS && claim_view(device, &limit, &used))
        apply(&memory->total, &memory->free, &memory->used, limit, used);
    return rc;
}

SHIM_EXPORT nvmlReturn_t nvmlDeviceGetMemoryInfo_v2(nvmlDevice_t device, nvmlMemory_v2_t *memory)
{
    pthread_once(&once, init);
    if (real.get_memory_v2 == NULL)
        return NVML_ERROR_FUNCTION_NOT_FOUND;
    nvmlReturn_t rc = real.get_memory_v2(device, memory);
    uint64_t limit = 0, used = 0;
    if (rc == NVML_SUCCESS && claim_view(device, &limit, &used)) {
        apply(&memory->total, &memory->free, &memory->used, limit, used);
        memory->reserved = 0; /* the driver's reservation is not part of the claim's share */
    }
    return rc;
}
