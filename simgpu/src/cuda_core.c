/* cuInit, versions and the guard every CUDA entry point passes through. */
#include <stdlib.h>
#include <string.h>

#include "cuda_internal.h"
#include "devmem.h"

struct sim_cuda sim_cuda = {.mu = PTHREAD_MUTEX_INITIALIZER};

/* pthread_atfork child handler: the child must call nothing. (Checking getpid() on every call
 * instead would cost a system call per call.) */
static void mark_forked(void)
{
    sim_cuda.forked = true;
}

/* Remembered so that every later cuInit fails the same way, as the real driver does. */
static CUresult init_result = CUDA_ERROR_NOT_INITIALIZED;

SIMGPU_API CUresult cuInit(unsigned int flags)
{
    if (flags != 0)
        return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&sim_cuda.mu);
    if (init_result == CUDA_ERROR_NOT_INITIALIZED) {
        switch (sim_runtime_open(&sim_cuda.rt)) {
        case SIM_OPEN_NO_CONFIG:
            init_result = CUDA_ERROR_NO_DEVICE; /* what libcuda says on a machine without GPUs */
            break;
        case SIM_OPEN_FAILED:
            init_result = CUDA_ERROR_UNKNOWN;
            break;
        case SIM_OPEN_OK:
            sim_node_lock(&sim_cuda.rt.node);
            int reg = sim_node_register(&sim_cuda.rt.node);
            sim_node_unlock(&sim_cuda.rt.node);
            sim_cuda_select_visible(&sim_cuda.rt.cfg, getenv("CUDA_VISIBLE_DEVICES"));
            if (reg != 0) {
                sim_log("%s: all %d process slots of the node are taken",
                        sim_cuda.rt.cfg.state_file, SIM_MAX_PROCS);
                init_result = CUDA_ERROR_UNKNOWN;
            } else if (sim_cuda.rt.cfg.gpu_count == 0) {
                init_result = CUDA_ERROR_NO_DEVICE; /* none configured, or none visible */
            } else {
                init_result = CUDA_SUCCESS;
                pthread_atfork(NULL, NULL, mark_forked);
                sim_cuda.initialized = true;
            }
            break;
        }
    }
    CUresult rc = init_result;
    pthread_mutex_unlock(&sim_cuda.mu);
    if (rc == CUDA_SUCCESS)
        sim_faults_on_call(&sim_cuda.rt);
    return rc;
}

CUresult sim_cuda_enter(void)
{
    if (!__atomic_load_n(&sim_cuda.initialized, __ATOMIC_ACQUIRE))
        return CUDA_ERROR_NOT_INITIALIZED;
    if (sim_cuda.forked)
        return CUDA_ERROR_NOT_INITIALIZED; /* a forked child inherits no usable driver state */
    sim_faults_on_call(&sim_cuda.rt);
    return CUDA_SUCCESS;
}

int sim_driver_version(void)
{
    /* Valid before cuInit, as on the real driver; without a configuration there is no driver
     * version to report, so answer with the simulator's default. The configured version never
     * changes in a running process, so the file is read once (cuGetProcAddress asks for it
     * hundreds of times while a client loads). */
    if (__atomic_load_n(&sim_cuda.initialized, __ATOMIC_ACQUIRE))
        return sim_cuda.rt.cfg.cuda_driver_version;
    static int loaded;
    int version = __atomic_load_n(&loaded, __ATOMIC_ACQUIRE);
    if (version != 0)
        return version;
    const char *path = getenv(SIM_CONFIG_ENV);
    static struct sim_config cfg;
    char err[512];
    pthread_mutex_lock(&sim_cuda.mu);
    bool ok = path != NULL && sim_config_load(path, &cfg, err, sizeof err) == 0;
    version = ok ? cfg.cuda_driver_version : SIM_DEFAULT_CUDA_DRIVER_VERSION;
    if (ok)
        __atomic_store_n(&loaded, version, __ATOMIC_RELEASE);
    pthread_mutex_unlock(&sim_cuda.mu);
    return version;
}

SIMGPU_API CUresult cuDriverGetVersion(int *version)
{
    if (version == NULL)
        return CUDA_ERROR_INVALID_VALUE;
    *version = sim_driver_version();
    return CUDA_SUCCESS;
}

CUresult sim_check_device(CUdevice dev)
{
    if (dev < 0 || dev >= sim_cuda.rt.cfg.gpu_count)
        return CUDA_ERROR_INVALID_DEVICE;
    if (sim_fault_gpu_lost(&sim_cuda.rt, dev))
        return SIM_CUDA_GPU_LOST;
    return CUDA_SUCCESS;
}

CUresult sim_devmem_reserve(int gpu, uint64_t bytes, uint32_t *handle)
{
    uint64_t fail_at = sim_fault_fail_alloc(&sim_cuda.rt, gpu);
    uint64_t attempt = __atomic_add_fetch(&sim_cuda.alloc_attempts[gpu], 1, __ATOMIC_RELAXED);
    if (fail_at != 0 && attempt == fail_at)
        return CUDA_ERROR_OUT_OF_MEMORY;
    uint64_t total = sim_cuda.rt.cfg.gpus[gpu].memory_bytes;
    if (sim_mem_reserve(&sim_cuda.rt.node, sim_node_mem(gpu), total, bytes, handle) != 0)
        return CUDA_ERROR_OUT_OF_MEMORY;
    return CUDA_SUCCESS;
}
