/* Device memory accounting in the shared allocation table. */
#include "devmem.h"

uint64_t sim_mem_used_locked(struct sim_node *node, int gpu)
{
    const struct sim_shared *sh = node->sh;
    uint64_t used = 0;
    for (uint32_t i = 0; i < sh->alloc_hwm; i++) {
        if (sh->allocs[i].used && sh->allocs[i].gpu == gpu)
            used += sh->allocs[i].bytes;
    }
    return used;
}

uint64_t sim_mem_used_by_locked(struct sim_node *node, int gpu, int slot)
{
    const struct sim_shared *sh = node->sh;
    uint64_t used = 0;
    for (uint32_t i = 0; i < sh->alloc_hwm; i++) {
        if (sh->allocs[i].used && sh->allocs[i].gpu == gpu && sh->allocs[i].proc == slot)
            used += sh->allocs[i].bytes;
    }
    return used;
}

static int find_free_entry(struct sim_shared *sh, uint32_t *index)
{
    for (uint32_t i = 0; i < SIM_MAX_ALLOCS; i++) {
        if (!sh->allocs[i].used) {
            *index = i;
            return 0;
        }
    }
    return -1;
}

int sim_mem_reserve(struct sim_node *node, int gpu, uint64_t total, uint64_t bytes,
                    uint32_t *handle)
{
    struct sim_shared *sh = node->sh;
    sim_node_lock(node);
    uint64_t used = sim_mem_used_locked(node, gpu);
    if (used + bytes > total || bytes > total) {
        /* Only now is it worth checking for dead processes: the common case stays cheap. */
        sim_node_reap(node);
        used = sim_mem_used_locked(node, gpu);
    }
    uint32_t i = 0;
    int rc = -1;
    if (bytes <= total && used + bytes <= total && find_free_entry(sh, &i) == 0) {
        sh->allocs[i].gpu = (uint16_t)gpu;
        sh->allocs[i].proc = (uint16_t)node->my_slot;
        sh->allocs[i].bytes = bytes;
        if (i + 1 > sh->alloc_hwm)
            sh->alloc_hwm = i + 1;
        sh->allocs[i].used = 1; /* last: a death before this leaves the entry free */
        *handle = i;
        rc = 0;
    }
    sim_node_unlock(node);
    return rc;
}

void sim_mem_release(struct sim_node *node, uint32_t handle)
{
    struct sim_shared *sh = node->sh;
    sim_node_lock(node);
    if (handle < SIM_MAX_ALLOCS && sh->allocs[handle].used &&
        sh->allocs[handle].proc == node->my_slot)
        sh->allocs[handle].used = 0;
    sim_node_unlock(node);
}
