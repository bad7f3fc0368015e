/*
 * Physical device memory, accounted across every process of the node in the shared allocation
 * table. Bytes are only bookkeeping here; the CUDA library backs them with host address space.
 */
#ifndef SIMGPU_DEVMEM_H
#define SIMGPU_DEVMEM_H

#include <stdint.h>

#include "state.h"

/*
 * Reserve `bytes` on `gpu` (capacity `total`) for this process. Returns 0 and a handle, or -1 when
 * the GPU does not have that much free (after freeing dead processes' memory) or the allocation
 * table is full. Takes the lock.
 */
int sim_mem_reserve(struct sim_node *node, int gpu, uint64_t total, uint64_t bytes,
                    uint32_t *handle);

/* Give back a reservation made by this process. Takes the lock. */
void sim_mem_release(struct sim_node *node, uint32_t handle);

/* Bytes in use on `gpu` by all live processes. Needs the lock (and reaps first if asked). */
uint64_t sim_mem_used_locked(struct sim_node *node, int gpu);

/* Bytes in use on `gpu` by the process in `slot`. Needs the lock. */
uint64_t sim_mem_used_by_locked(struct sim_node *node, int gpu, int slot);

#endif
