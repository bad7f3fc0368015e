/*
 * The process's record of its device allocations. Device memory is backed by private anonymous
 * host mappings (reserved lazily, so a simulated 80 GiB costs nothing until written), which makes
 * copies and memsets real: data written to the device reads back. Device pointers are therefore
 * host addresses, unique per process as unified addressing requires.
 */
#ifndef SIMGPU_CUDA_MEMORY_H
#define SIMGPU_CUDA_MEMORY_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "cuda_internal.h"

enum sim_alloc_kind {
    ALLOC_DEVICE,  /* cuMemAlloc, cuMemAllocPitch */
    ALLOC_MANAGED, /* cuMemAllocManaged: counted on the device, also host-accessible */
    ALLOC_POOL,    /* cuMemAllocAsync / cuMemAllocFromPoolAsync */
    ALLOC_HOST,    /* cuMemAllocHost: pinned host memory, not counted on the device */
    ALLOC_IPC,     /* cuIpcOpenMemHandle: another process's allocation, counted to it */
    ALLOC_GRAPH,   /* a graph allocation node's, live between its launch and its free */
};

#define SIM_IPC_NAME_MAX 48

struct sim_pool_chunk;  /* cuda_pool.c */
struct sim_graph_block; /* cuda_graph_mem.c */

struct sim_alloc_rec {
    uintptr_t base;
    size_t size;
    CUcontext ctx;
    enum sim_alloc_kind kind;
    uint32_t handle; /* shared-table reservation; unused for ALLOC_HOST and ALLOC_POOL */
    CUmemoryPool pool;
    struct sim_pool_chunk *chunk; /* ALLOC_POOL: the pool's reservation it is carved from */
    struct sim_graph_block *graph_block; /* ALLOC_GRAPH: the node's memory */
    bool exported;                /* cuIpcGetMemHandle moved its backing to a file (cuda_ipc.c) */
    int ipc_refs;                 /* ALLOC_IPC: opens minus closes */
    char ipc_name[SIM_IPC_NAME_MAX]; /* exported or ALLOC_IPC: the file's name (cuda_ipc.c) */
    unsigned long long buffer_id;    /* CU_POINTER_ATTRIBUTE_BUFFER_ID; 0 until first asked */
    struct sim_alloc_rec *next;
};

/* Bytes are accounted in units of this, as real allocators round small requests up. */
#define SIM_ALLOC_ROUNDING 512u

/* Host address space backing `bytes` of device memory (private, reserved lazily), or NULL. */
void *sim_backing_map(size_t bytes);

/* Reserve device memory and map backing for it; the record is linked into the registry. Not
 * for ALLOC_POOL: pool blocks are carved from their pool's reservation (cuda_pool.c). */
CUresult sim_alloc(CUcontext ctx, size_t bytes, enum sim_alloc_kind kind,
                   struct sim_alloc_rec **out);

/* Unlink, unmap and give the reservation back (a pool block's stays with its pool). Needs mu. */
void sim_free_rec(struct sim_alloc_rec *rec);

/* Add to / remove from the registry without touching the reservation (pool caching). Need mu. */
void sim_link_alloc(struct sim_alloc_rec *rec);
void sim_unlink_alloc(struct sim_alloc_rec *rec);

/* A pool allocation freed (cuMemFreeAsync, or cuMemFree, which CUDA allows for it): back to its
 * pool's cache, unlinked from the registry. Needs mu. */
void sim_pool_return_block(struct sim_alloc_rec *rec);

/* A pool allocation freed with its context: drop it from the pool's statistics (its memory
 * stays reserved in the pool). Needs mu; call before sim_free_rec. */
void sim_pool_forget(const struct sim_alloc_rec *rec);

/* An exported allocation is freed: remove its file (the importers keep their mappings). */
void sim_ipc_forget(const struct sim_alloc_rec *rec);

/* The first record of the registry (follow `next`). Needs mu. */
struct sim_alloc_rec *sim_first_alloc(void);

/* The allocation starting exactly at `ptr`, or NULL. Needs mu. */
struct sim_alloc_rec *sim_find_alloc(uintptr_t ptr);

/* The allocation containing `ptr`, or NULL. Needs mu. */
struct sim_alloc_rec *sim_find_containing(uintptr_t ptr);

/* The mapped VMM range containing `ptr` (cuda_vmm.c): its start, size and the handle types its
 * allocation may be exported as. Needs mu. */
bool sim_vmm_mapping_at(uintptr_t ptr, uintptr_t *base, size_t *size,
                        unsigned long long *handle_types);

/* Whether [ptr, ptr+bytes) lies in device memory of this process (any kind but host, or a
 * mapped VMM range). Takes mu. */
bool sim_device_range_valid(uintptr_t ptr, size_t bytes);

/* Whether [ptr, ptr+bytes) lies within one mapped VMM range (cuda_vmm.c). Needs mu. */
bool sim_vmm_range_mapped(uintptr_t ptr, size_t bytes);

#endif
