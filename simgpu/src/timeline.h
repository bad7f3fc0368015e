/*
 * Each GPU's kernel timeline. The device runs one kernel at a time, from any process (time
 * slicing without MPS): a kernel starts when the GPU is free and its stream's earlier work is
 * done, and occupies the GPU for its duration. Every stretch of busy time is kept in a ring of
 * intervals per GPU, from which NVML derives utilisation, so NVML reports exactly the timeline
 * that the CUDA side produced.
 */
#ifndef SIMGPU_TIMELINE_H
#define SIMGPU_TIMELINE_H

#include <stdint.h>

#include "state.h"

uint64_t sim_now_ns(void); /* CLOCK_MONOTONIC, the timeline's clock */

/* Sleep until CLOCK_MONOTONIC reaches `deadline_ns`. */
void sim_sleep_until(uint64_t deadline_ns);

/*
 * Queue a kernel of `duration_ns` for this process on `gpu`, starting no earlier than
 * `not_before_ns`. Returns its end time. Takes the lock.
 */
uint64_t sim_tl_submit(struct sim_node *node, int gpu, uint64_t not_before_ns,
                       uint64_t duration_ns);

/* Nanoseconds within [from, to) during which `gpu` ran kernels. Needs the lock. */
uint64_t sim_tl_busy_locked(struct sim_node *node, int gpu, uint64_t from, uint64_t to);

struct sim_proc_busy {
    int32_t pid; /* as the launching process saw itself */
    uint16_t proc;
    uint32_t gen;
    uint64_t busy_ns;
};

/* Per-process busy time within [from, to); returns how many entries were filled. Needs the
 * lock. */
int sim_tl_busy_by_process_locked(struct sim_node *node, int gpu, uint64_t from, uint64_t to,
                                  struct sim_proc_busy *out, int cap);

#endif
