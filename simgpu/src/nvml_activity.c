/*
 * NVML's view of what is happening on a GPU, read from the shared device model: memory in use,
 * utilisation over the sample window (from the kernel timeline), running compute processes and
 * per-process utilisation samples.
 */
#include <string.h>
#include <time.h>

#include "devmem.h"
#include "nvml_internal.h"
#include "timeline.h"

/* Device memory in use in a memory domain (a GPU, or a MIG instance) by live processes. */
static uint64_t memory_used(int domain)
{
    struct sim_node *node = &sim_nvml.rt.node;
    sim_node_lock(node);
    sim_node_reap(node);
    uint64_t used = sim_mem_used_locked(node, domain);
    sim_node_unlock(node);
    return used;
}

/* Total memory and memory in use of a GPU or, for a MIG device handle, of that instance alone. */
static nvmlReturn_t memory_of(nvmlDevice_t device, uint64_t *total, uint64_t *used)
{
    int i = 0, mig = -1;
    nvmlReturn_t rc = sim_nvml_any_device(device, &i, &mig);
    if (rc != NVML_SUCCESS)
        return rc;
    const struct sim_gpu_config *g = &sim_nvml.rt.cfg.gpus[i];
    *total = mig < 0 ? g->memory_bytes : g->mig[mig].memory_bytes;
    *used = memory_used(mig < 0 ? i : SIM_MAX_GPUS + i * SIM_MAX_MIG + mig);
    return NVML_SUCCESS;
}

SIMGPU_API nvmlReturn_t nvmlDeviceGetMemoryInfo(nvmlDevice_t device, nvmlMemory_t *memory)
{
    uint64_t total = 0, used = 0;
    nvmlReturn_t rc = memory_of(device, &total, &used);
    if (rc == NVML_SUCCESS && memory == NULL)
        rc = NVML_ERROR_INVALID_ARGUMENT;
    if (rc != NVML_SUCCESS)
        return rc;
    memory->total = total;
    memory->used = used;
    memory->free = used < total ? total - used : 0;
    return NVML_SUCCESS;
}

SIMGPU_API nvmlReturn_t nvmlDeviceGetMemoryInfo_v2(nvmlDevice_t device, nvmlMemory_v2_t *memory)
{
    uint64_t total = 0, used = 0;
    nvmlReturn_t rc = memory_of(device, &total, &used);
    if (rc == NVML_SUCCESS && memory == NULL)
        rc = NVML_ERROR_INVALID_ARGUMENT;
    if (rc == NVML_SUCCESS && memory->version != nvmlMemory_v2)
        rc = NVML_ERROR_ARGUMENT_VERSION_MISMATCH;
    if (rc != NVML_SUCCESS)
        return rc;
    memory->total = total;
    memory->reserved = 0; /* the simulator keeps no memory back for the driver */
    memory->used = used;
    memory->free = used < total ? total - used : 0;
    return NVML_SUCCESS;
}

static unsigned int percent(uint64_t part, uint64_t whole)
{
    return whole == 0 ? 0 : (unsigned int)((part * 100 + whole / 2) / whole);
}

SIMGPU_API nvmlReturn_t nvmlDeviceGetUtilizationRates(nvmlDevice_t device,
                                                      nvmlUtilization_t *utilization)
{
    int i = 0;
    nvmlReturn_t rc = sim_nvml_device(device, &i);
    if (rc == NVML_SUCCESS && utilization == NULL)
        rc = NVML_ERROR_INVALID_ARGUMENT;
    if (rc != NVML_SUCCESS)
        return rc;
    uint64_t window = sim_nvml.rt.cfg.util_window_ns;
    uint64_t now = sim_now_ns();
    struct sim_node *node = &sim_nvml.rt.node;
    sim_node_lock(node);
    uint64_t busy = sim_tl_busy_locked(node, i, now - window, now);
    sim_node_unlock(node);
    utilization->gpu = percent(busy, window);
    utilization->memory = 0; /* memory traffic is not modelled */
    return NVML_SUCCESS;
}

/* Live processes holding a context on GPU `index`, as (pid seen from here, slot). */
static int running(int index, unsigned int *pids, int *slots)
{
    struct sim_node *node = &sim_nvml.rt.node;
    int n = 0;
    for (int s = 0; s < SIM_MAX_PROCS; s++) {
        int32_t pid = 0;
        if ((node->sh->procs[s].ctx_mask & (1u << index)) != 0 &&
            sim_node_proc_alive(node, s, &pid) && pid > 0) {
            pids[n] = (unsigned int)pid;
            slots[n] = s;
            n++;
        }
    }
    return n;
}

/* The two-call protocol every NVML list query follows: report the count when the buffer is
 * missing or short. `entry` is sizeof one element of the caller's layout. */
static nvmlReturn_t list_processes(nvmlDevice_t device, unsigned int *infoCount, void *infos,
                                   size_t entry, bool compute)
{
    int i = 0;
    nvmlReturn_t rc = sim_nvml_device(device, &i);
    if (rc == NVML_SUCCESS && infoCount == NULL)
        rc = NVML_ERROR_INVALID_ARGUMENT;
    if (rc != NVML_SUCCESS)
        return rc;
    unsigned int pids[SIM_MAX_PROCS];
    int slots[SIM_MAX_PROCS];
    uint64_t used[SIM_MAX_PROCS];
    struct sim_node *node = &sim_nvml.rt.node;
    sim_node_lock(node);
    sim_node_reap(node);
    int n = compute ? running(i, pids, slots) : 0;
    for (int k = 0; k < n; k++)
        used[k] = sim_mem_used_by_locked(node, i, slots[k]);
    sim_node_unlock(node);
    if (n > 0 && (infos == NULL || *infoCount < (unsigned int)n)) {
        *infoCount = (unsigned int)n;
        return NVML_ERROR_INSUFFICIENT_SIZE;
    }
    for (int k = 0; k < n; k++) {
        char *at = (char *)infos + (size_t)k * entry;
        if (entry == sizeof(nvmlProcessInfo_v1_t)) {
            nvmlProcessInfo_v1_t info = {.pid = pids[k], .usedGpuMemory = used[k]};
            memcpy(at, &info, sizeof info);
        } else {
            /* Not a MIG instance: the instance ids read as "not available". */
            nvmlProcessInfo_t info = {.pid = pids[k], .usedGpuMemory = used[k],
                                      .gpuInstanceId = 0xffffffffu,
                                      .computeInstanceId = 0xffffffffu};
            memcpy(at, &info, sizeof info);
        }
    }
    *infoCount = (unsigned int)n;
    return NVML_SUCCESS;
}

SIMGPU_API nvmlReturn_t nvmlDeviceGetComputeRunningProcesses(nvmlDevice_t device,
                                                             unsigned int *infoCount,
                                                             nvmlProcessInfo_v1_t *infos)
{
    return list_processes(device, infoCount, infos, sizeof *infos, true);
}

SIMGPU_API nvmlReturn_t nvmlDeviceGetComputeRunningProcesses_v2(nvmlDevice_t device,
                                                                unsigned int *infoCount,
                                                                nvmlProcessInfo_t *infos)
{
    return list_processes(device, infoCount, infos, sizeof *infos, true);
}

SIMGPU_API nvmlReturn_t nvmlDeviceGetComputeRunningProcesses_v3(nvmlDevice_t device,
                                                                unsigned int *infoCount,
                                                                nvmlProcessInfo_t *infos)
{
    return list_processes(device, infoCount, infos, sizeof *infos, true);
}

/* Simulated GPUs run no graphics work. */
SIMGPU_API nvmlReturn_t nvmlDeviceGetGraphicsRunningProcesses_v3(nvmlDevice_t device,
                                                                 unsigned int *infoCount,
                                                                 nvmlProcessInfo_t *infos)
{
    return list_processes(device, infoCount, infos, sizeof *infos, false);
}

static uint64_t realtime_us(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (uint64_t)ts.tv_sec * 1000000ULL + (uint64_t)ts.tv_nsec / 1000ULL;
}

SIMGPU_API nvmlReturn_t nvmlDeviceGetProcessUtilization(
    nvmlDevice_t device, nvmlProcessUtilizationSample_t *utilization,
    unsigned int *processSamplesCount, unsigned long long lastSeenTimeStamp)
{
    int i = 0;
    nvmlReturn_t rc = sim_nvml_device(device, &i);
    if (rc == NVML_SUCCESS && processSamplesCount == NULL)
        rc = NVML_ERROR_INVALID_ARGUMENT;
    if (rc != NVML_SUCCESS)
        return rc;
    /* The window is the sample window, or less if the caller has seen part of it already.
     * lastSeenTimeStamp is wall-clock microseconds, like the timestamps returned. */
    uint64_t now = sim_now_ns(), now_us = realtime_us();
    uint64_t window = sim_nvml.rt.cfg.util_window_ns;
    if (lastSeenTimeStamp > now_us)
        return NVML_ERROR_NOT_FOUND;
    if (lastSeenTimeStamp > 0 && (now_us - lastSeenTimeStamp) * 1000ULL < window)
        window = (now_us - lastSeenTimeStamp) * 1000ULL;
    struct sim_proc_busy busy[SIM_MAX_PROCS];
    struct sim_node *node = &sim_nvml.rt.node;
    sim_node_lock(node);
    int n = sim_tl_busy_by_process_locked(node, i, now - window, now, busy, SIM_MAX_PROCS);
    for (int k = 0; k < n; k++) {
        /* Report a live process by its pid as seen from here; a finished one by its own. */
        int32_t pid = 0;
        if (node->sh->procs[busy[k].proc].gen == busy[k].gen &&
            sim_node_proc_alive(node, busy[k].proc, &pid))
            busy[k].pid = pid;
    }
    sim_node_unlock(node);
    if (n == 0)
        return NVML_ERROR_NOT_FOUND;
    if (utilization == NULL || *processSamplesCount < (unsigned int)n) {
        *processSamplesCount = (unsigned int)n;
        return NVML_ERROR_INSUFFICIENT_SIZE;
    }
    for (int k = 0; k < n; k++) {
        utilization[k] = (nvmlProcessUtilizationSample_t){
            .pid = (unsigned int)busy[k].pid,
            .timeStamp = now_us,
            .smUtil = percent(busy[k].busy_ns, window),
        };
    }
    *processSamplesCount = (unsigned int)n;
    return NVML_SUCCESS;
}
