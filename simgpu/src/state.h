/*
 * The simulated node's device model, shared by every process on the node: one file (the config's
 * state_file) mapped MAP_SHARED. It holds the process table, the device-memory allocation table
 * and each GPU's kernel timeline.
 *
 * Robustness to a process dying at any instant:
 *  - one pthread mutex, process-shared and robust, guards the whole region; a waiter that gets
 *    EOWNERDEAD marks it consistent. No field is derived from another (memory in use is summed
 *    from the allocation table, never kept as a counter), so a half-finished update leaves at
 *    worst one orphaned entry, which the reaper frees with its owner.
 *  - each registered process holds a POSIX record lock on one byte of the state file
 *    (SIM_LIVENESS_BASE + slot). The kernel drops it when the process dies, however it dies, so
 *    liveness needs no pid polling and is immune to pid reuse; F_GETLK also reports the holder's
 *    pid translated into the caller's pid namespace, which is what NVML must report.
 */
#ifndef SIMGPU_STATE_H
#define SIMGPU_STATE_H

#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "config.h"

#define SIM_MAX_PROCS 256
#define SIM_MAX_ALLOCS 16384
#define SIM_RING 4096
#define SIM_LIVENESS_BASE (1LL << 30)
#define SIM_STATE_MAGIC 0x5445535345524153ULL /* "TESSERAS" */
#define SIM_STATE_LAYOUT 1

struct sim_identity {
    int32_t pid;          /* getpid() in the process's own pid namespace */
    uint64_t ns_ino;      /* inode of /proc/self/ns/pid: tells namespaces apart */
    uint64_t start_ticks; /* process start time: tells pid reuse apart */
};

struct sim_proc_slot {
    uint32_t used;
    uint32_t gen; /* bumped whenever the slot is freed, so old timeline entries are not reused */
    uint32_t ctx_mask; /* GPUs on which the process holds a context (NVML's "running processes") */
    uint32_t pad;
    struct sim_identity id;
};

struct sim_alloc_slot {
    uint32_t used;
    uint16_t gpu;
    uint16_t proc;
    uint64_t bytes;
};

/* One stretch of time the GPU spent running kernels of one process. */
struct sim_interval {
    uint64_t start_ns;
    uint64_t end_ns;
    int32_t pid;
    uint16_t proc;
    uint16_t pad;
    uint32_t gen;
    uint32_t pad2;
};

struct sim_gpu_state {
    uint64_t busy_until_ns; /* end of the last kernel queued on this GPU, CLOCK_MONOTONIC */
    uint64_t ring_count;    /* intervals ever recorded; the newest is at (ring_count-1) % SIM_RING */
    struct sim_interval ring[SIM_RING];
};

struct sim_shared {
    uint64_t magic;
    uint32_t layout;
    uint32_t gpu_count;
    uint64_t fingerprint;
    pthread_mutex_t lock;
    uint32_t alloc_hwm; /* allocation slots at or above this index are all unused */
    uint32_t pad;
    struct sim_proc_slot procs[SIM_MAX_PROCS];
    struct sim_alloc_slot allocs[SIM_MAX_ALLOCS];
    struct sim_gpu_state gpus[SIM_MAX_GPUS];
};

/* One library's view of the node in this process. */
struct sim_node {
    int fd;
    struct sim_shared *sh;
    int my_slot; /* -1 until sim_node_register */
    struct sim_identity me;
};

/* Map (creating or re-initialising when needed) the state file. -1 with a message on failure. */
int sim_node_open(struct sim_node *node, const struct sim_config *cfg, char *err, size_t errlen);

void sim_node_lock(struct sim_node *node);
void sim_node_unlock(struct sim_node *node);

/* Take a process slot and its liveness lock (libcuda does this at cuInit). Needs the lock. */
int sim_node_register(struct sim_node *node);

/* Free the slots and memory of processes that have died. Needs the lock. */
void sim_node_reap(struct sim_node *node);

/*
 * Whether the process in `slot` is alive; if so, its pid as this process sees it (0 when it
 * lives in a pid namespace this process cannot see). Needs the lock.
 */
bool sim_node_proc_alive(struct sim_node *node, int slot, int32_t *visible_pid);

#endif
