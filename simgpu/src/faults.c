/*
 * Fault injection. Faults live in the same configuration file as the GPUs; a test or the test
 * bed rewrites the file (atomically, by rename) and every process notices on its first API call
 * once SIM_FAULT_POLL_NS have passed since it last looked, so a GPU can fall off the bus under
 * running workloads. Only fault keys and a GPU's MIG mode are taken from a changed file; the GPU
 * topology of a running process (MIG instances included) never changes.
 */
#include <string.h>
#include <time.h>

#include "log.h"
#include "runtime.h"
#include "timeline.h"

static bool file_changed(const struct stat *a, const struct stat *b)
{
    return a->st_ino != b->st_ino || a->st_dev != b->st_dev || a->st_size != b->st_size ||
           a->st_mtim.tv_sec != b->st_mtim.tv_sec || a->st_mtim.tv_nsec != b->st_mtim.tv_nsec;
}

static void reload_faults(struct sim_runtime *rt)
{
    static struct sim_config fresh; /* large; reloads are serialised by watch_mu */
    char err[1024];
    if (sim_config_load(rt->cfg.path, &fresh, err, sizeof err) != 0) {
        sim_log("keeping previous fault settings: %s", err);
        return;
    }
    if (fresh.gpu_count != (int)rt->node.sh->gpu_count)
        sim_log("%s: GPU count changed; only fault settings apply to running processes",
                rt->cfg.path);
    /* rt->cfg.gpus may be a reordered subset (libcuda under CUDA_VISIBLE_DEVICES): match each
     * GPU with its own section of the file. */
    for (int i = 0; i < rt->cfg.gpu_count; i++) {
        int n = rt->cfg.gpus[i].node_index;
        if (n >= fresh.gpu_count)
            continue;
        __atomic_store_n(&rt->cfg.gpus[i].faults.lost, fresh.gpus[n].faults.lost,
                         __ATOMIC_RELAXED);
        __atomic_store_n(&rt->cfg.gpus[i].faults.fail_alloc, fresh.gpus[n].faults.fail_alloc,
                         __ATOMIC_RELAXED);
        __atomic_store_n(&rt->cfg.gpus[i].faults.nvml_hang, fresh.gpus[n].faults.nvml_hang,
                         __ATOMIC_RELAXED);
        __atomic_store_n(&rt->cfg.gpus[i].mig_mode, fresh.gpus[n].mig_mode, __ATOMIC_RELAXED);
    }
    __atomic_store_n(&rt->cfg.latency_ns, fresh.latency_ns, __ATOMIC_RELAXED);
}

/* CLOCK_MONOTONIC_COARSE: read from the vDSO without touching the hardware clock (a few ns),
 * at the resolution of the kernel's tick. */
static uint64_t coarse_now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC_COARSE, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ULL + (uint64_t)ts.tv_nsec;
}

static void poll_config(struct sim_runtime *rt, uint64_t now)
{
    pthread_mutex_lock(&rt->watch_mu);
    if (now >= rt->next_poll_ns) { /* not already done by another thread meanwhile */
        __atomic_store_n(&rt->next_poll_ns, now + SIM_FAULT_POLL_NS, __ATOMIC_RELAXED);
        struct stat st;
        if (stat(rt->cfg.path, &st) == 0 && file_changed(&st, &rt->watched)) {
            rt->watched = st;
            reload_faults(rt);
        }
    }
    pthread_mutex_unlock(&rt->watch_mu);
}

void sim_faults_on_call(struct sim_runtime *rt)
{
    uint64_t now = coarse_now_ns();
    if (now >= __atomic_load_n(&rt->next_poll_ns, __ATOMIC_RELAXED))
        poll_config(rt, now);
    uint64_t latency = __atomic_load_n(&rt->cfg.latency_ns, __ATOMIC_RELAXED);
    if (latency > 0)
        sim_sleep_until(sim_now_ns() + latency);
}

bool sim_mig_mode(struct sim_runtime *rt, int gpu)
{
    return __atomic_load_n(&rt->cfg.gpus[gpu].mig_mode, __ATOMIC_RELAXED);
}

bool sim_fault_gpu_lost(struct sim_runtime *rt, int gpu)
{
    return __atomic_load_n(&rt->cfg.gpus[gpu].faults.lost, __ATOMIC_RELAXED);
}

void sim_fault_nvml_hang(struct sim_runtime *rt, int gpu)
{
    /* A wedged driver as NVML's callers meet it: the call neither answers nor fails. It keeps
     * looking at the configuration file, so clearing the fault lets it return as if nothing had
     * happened (what a driver that recovers does). */
    while (__atomic_load_n(&rt->cfg.gpus[gpu].faults.nvml_hang, __ATOMIC_RELAXED)) {
        sim_sleep_until(sim_now_ns() + SIM_FAULT_POLL_NS);
        sim_faults_on_call(rt);
    }
}

uint64_t sim_fault_fail_alloc(struct sim_runtime *rt, int gpu)
{
    return __atomic_load_n(&rt->cfg.gpus[gpu].faults.fail_alloc, __ATOMIC_RELAXED);
}
