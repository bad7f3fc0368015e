/*
 * Stream-ordered allocation and memory pools. As on a GPU, a pool reserves device memory in
 * chunks and suballocates: an allocation that fits in no chunk's free space grows the
 * reservation by a chunk of its size rounded up to SIM_POOL_CHUNK. Memory freed with
 * cuMemFreeAsync is not returned to the device at once: it stays reserved in its pool (visible to
 * cuMemGetInfo and NVML) for reuse, and whole chunks nothing is allocated from are released at
 * the next synchronisation down to the pool's release threshold (0 by default), or by
 * cuMemPoolTrimTo.
 */
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "cuda_memory.h"
#include "devmem.h"

/* What a pool's reservation grows by, at least (real drivers: 2 MiB or more). */
#define SIM_POOL_CHUNK (2u << 20)

/* One growth of a pool's reservation. Its blocks (live or cached) take `used` + `cached`
 * bytes of it, rounded as device allocations are; the rest is free. */
struct sim_pool_chunk {
    uint32_t handle; /* shared-table reservation */
    uint64_t size, used, cached;
    struct sim_pool_chunk *next;
};

struct CUmemPoolHandle_st {
    uint32_t tag;
    CUdevice device;
    uint64_t release_threshold;
    int reuse_flags[4]; /* the three REUSE_* attributes, indexed by attribute number */
    uint64_t used, used_high;
    uint64_t cached; /* freed blocks kept for reuse */
    uint64_t reserved, reserved_high; /* the chunks' sizes */
    struct sim_alloc_rec *free_list; /* freed blocks, unlinked from the allocation registry */
    struct sim_pool_chunk *chunks;   /* newest first */
};

static struct CUmemPoolHandle_st default_pools[SIM_MAX_GPUS];
static CUmemoryPool current_pools[SIM_MAX_GPUS];

static CUmemoryPool default_pool(CUdevice dev)
{
    CUmemoryPool p = &default_pools[dev];
    if (p->tag != TAG_POOL) {
        p->tag = TAG_POOL;
        p->device = dev;
        for (int i = 1; i <= 3; i++)
            p->reuse_flags[i] = 1;
    }
    return p;
}

static CUmemoryPool current_pool(CUdevice dev)
{
    if (current_pools[dev] == NULL)
        current_pools[dev] = default_pool(dev);
    return current_pools[dev];
}

static bool pool_valid(CUmemoryPool pool)
{
    return pool != NULL && pool->tag == TAG_POOL;
}

static uint64_t round_up(uint64_t v, uint64_t unit)
{
    return (v + unit - 1) / unit * unit;
}

/* What a block takes of its chunk. */
static uint64_t block_bytes(size_t size)
{
    return round_up(size, SIM_ALLOC_ROUNDING);
}

/* Drop the cached blocks of `chunk` (all of the pool's if NULL): their space becomes free.
 * Needs mu. */
static void drop_cached(CUmemoryPool pool, struct sim_pool_chunk *chunk)
{
    struct sim_alloc_rec **link = &pool->free_list;
    while (*link != NULL) {
        struct sim_alloc_rec *rec = *link;
        if (chunk != NULL && rec->chunk != chunk) {
            link = &rec->next;
            continue;
        }
        *link = rec->next;
        pool->cached -= rec->size;
        rec->chunk->cached -= block_bytes(rec->size);
        rec->next = NULL;
        /* Not in the registry any more: sim_free_rec just unmaps. */
        sim_free_rec(rec);
    }
}

/* Release whole chunks nothing is allocated from, newest first, until the pool reserves at
 * most `keep` bytes (its allocations count: what is in use cannot be released), as
 * cuMemPoolTrimTo and the release threshold are defined. Needs mu. */
static void trim(CUmemoryPool pool, uint64_t keep)
{
    struct sim_pool_chunk **link = &pool->chunks;
    while (pool->reserved > keep && *link != NULL) {
        struct sim_pool_chunk *chunk = *link;
        if (chunk->used != 0) {
            link = &chunk->next;
            continue;
        }
        drop_cached(pool, chunk);
        *link = chunk->next;
        pool->reserved -= chunk->size;
        sim_mem_release(&sim_cuda.rt.node, chunk->handle);
        free(chunk);
    }
}

void sim_pools_trim_after_sync(CUdevice dev)
{
    pthread_mutex_lock(&sim_cuda.mu);
    if (default_pools[dev].tag == TAG_POOL)
        trim(&default_pools[dev], default_pools[dev].release_threshold);
    if (current_pools[dev] != NULL && current_pools[dev] != &default_pools[dev])
        trim(current_pools[dev], current_pools[dev]->release_threshold);
    pthread_mutex_unlock(&sim_cuda.mu);
}

void sim_pool_forget(const struct sim_alloc_rec *rec)
{
    rec->pool->used -= rec->size;
    rec->chunk->used -= block_bytes(rec->size);
    if (!pool_valid(rec->pool)) /* destroyed: what it still held goes once unused */
        trim(rec->pool, 0);
}

void sim_pools_release_context(CUcontext ctx)
{
    /* Blocks belong to pools, which outlive contexts; a context going away is a sync point. */
    if (default_pools[ctx->device].tag == TAG_POOL)
        trim(&default_pools[ctx->device], 0);
    if (current_pools[ctx->device] != NULL)
        trim(current_pools[ctx->device], 0);
}

/* A cached block of exactly `bytes`, taken off the free list, or NULL. Needs mu. */
static struct sim_alloc_rec *reuse_cached(CUmemoryPool pool, size_t bytes)
{
    for (struct sim_alloc_rec **link = &pool->free_list; *link != NULL; link = &(*link)->next) {
        struct sim_alloc_rec *rec = *link;
        if (rec->size == bytes) {
            *link = rec->next;
            pool->cached -= bytes;
            rec->chunk->cached -= block_bytes(bytes);
            return rec;
        }
    }
    return NULL;
}

/* A chunk with `need` bytes free, dropping a chunk's cached blocks to make room if that is
 * what it takes, or growing the reservation by a new chunk. NULL: the device is out of memory.
 * Needs mu. */
static struct sim_pool_chunk *chunk_for(CUmemoryPool pool, uint64_t need)
{
    for (struct sim_pool_chunk *c = pool->chunks; c != NULL; c = c->next)
        if (c->size - c->used - c->cached >= need)
            return c;
    for (struct sim_pool_chunk *c = pool->chunks; c != NULL; c = c->next) {
        if (c->size - c->used >= need) {
            drop_cached(pool, c);
            return c;
        }
    }
    struct sim_pool_chunk *c = calloc(1, sizeof *c);
    if (c == NULL)
        return NULL;
    c->size = round_up(need, SIM_POOL_CHUNK);
    if (sim_devmem_reserve(pool->device, c->size, &c->handle) != CUDA_SUCCESS) {
        free(c);
        return NULL;
    }
    c->next = pool->chunks;
    pool->chunks = c;
    pool->reserved += c->size;
    if (pool->reserved > pool->reserved_high)
        pool->reserved_high = pool->reserved;
    return c;
}

/* Carve a new block of `bytes` out of the pool's reservation. Needs mu. */
static CUresult carve(CUmemoryPool pool, size_t bytes, struct sim_alloc_rec **out)
{
    struct sim_alloc_rec *rec = calloc(1, sizeof *rec);
    if (rec == NULL)
        return CUDA_ERROR_OUT_OF_MEMORY;
    void *map = sim_backing_map(bytes);
    struct sim_pool_chunk *chunk = map == NULL ? NULL : chunk_for(pool, block_bytes(bytes));
    if (chunk == NULL) {
        if (map != NULL)
            munmap(map, bytes);
        free(rec);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    rec->base = (uintptr_t)map;
    rec->size = bytes;
    rec->kind = ALLOC_POOL;
    rec->pool = pool;
    rec->chunk = chunk;
    *out = rec;
    return CUDA_SUCCESS;
}

static CUresult alloc_from(CUdeviceptr *dptr, size_t bytes, CUmemoryPool pool, CUstream stream,
                           enum sim_default_stream mode)
{
    if (dptr == NULL || bytes == 0)
        return CUDA_ERROR_INVALID_VALUE;
    struct CUstream_st *s = NULL;
    CUresult rc = sim_resolve_stream(stream, mode, &s);
    if (rc != CUDA_SUCCESS)
        return rc;
    if (sim_fault_gpu_lost(&sim_cuda.rt, s->ctx->device))
        return SIM_CUDA_GPU_LOST;
    CUgraph capture = sim_stream_capture(s);
    if (capture != NULL) /* captured: an allocation node, whose memory comes at launch */
        return sim_graph_capture_alloc(capture, s->ctx->device, bytes, dptr);
    pthread_mutex_lock(&sim_cuda.mu);
    if (pool == NULL)
        pool = current_pool(s->ctx->device);
    if (!pool_valid(pool) || pool->device != s->ctx->device) {
        pthread_mutex_unlock(&sim_cuda.mu);
        return CUDA_ERROR_INVALID_VALUE;
    }
    /* Reuse a cached block of exactly this size before carving a new one. */
    struct sim_alloc_rec *rec = reuse_cached(pool, bytes);
    if (rec == NULL)
        rc = carve(pool, bytes, &rec);
    if (rc == CUDA_SUCCESS) {
        rec->ctx = s->ctx;
        sim_link_alloc(rec);
        rec->chunk->used += block_bytes(bytes);
        pool->used += bytes;
        if (pool->used > pool->used_high)
            pool->used_high = pool->used;
        *dptr = rec->base;
    }
    pthread_mutex_unlock(&sim_cuda.mu);
    return rc;
}

SIMGPU_API CUresult cuMemAllocAsync(CUdeviceptr *dptr, size_t bytesize, CUstream stream)
{
    SIM_ENTER();
    return alloc_from(dptr, bytesize, NULL, stream, SIM_LEGACY);
}

SIMGPU_API CUresult cuMemAllocAsync_ptsz(CUdeviceptr *dptr, size_t bytesize, CUstream stream)
{
    SIM_ENTER();
    return alloc_from(dptr, bytesize, NULL, stream, SIM_PER_THREAD);
}

static CUresult alloc_from_pool(CUdeviceptr *dptr, size_t bytesize, CUmemoryPool pool,
                                CUstream stream, enum sim_default_stream mode)
{
    SIM_ENTER();
    if (pool == NULL)
        return CUDA_ERROR_INVALID_VALUE;
    return alloc_from(dptr, bytesize, pool, stream, mode);
}

SIMGPU_API CUresult cuMemAllocFromPoolAsync(CUdeviceptr *dptr, size_t bytesize, CUmemoryPool pool,
                                            CUstream stream)
{
    return alloc_from_pool(dptr, bytesize, pool, stream, SIM_LEGACY);
}

SIMGPU_API CUresult cuMemAllocFromPoolAsync_ptsz(CUdeviceptr *dptr, size_t bytesize,
                                                 CUmemoryPool pool, CUstream stream)
{
    return alloc_from_pool(dptr, bytesize, pool, stream, SIM_PER_THREAD);
}

void sim_pool_return_block(struct sim_alloc_rec *rec)
{
    CUmemoryPool pool = rec->pool;
    sim_unlink_alloc(rec);
    rec->next = pool->free_list;
    pool->free_list = rec;
    pool->used -= rec->size;
    pool->cached += rec->size;
    rec->chunk->used -= block_bytes(rec->size);
    rec->chunk->cached += block_bytes(rec->size);
    if (!pool_valid(pool)) /* destroyed: what it still held goes once unused */
        trim(pool, 0);
}

static CUresult free_async(CUdeviceptr dptr, CUstream stream, enum sim_default_stream mode)
{
    SIM_ENTER();
    struct CUstream_st *s = NULL;
    CUresult rc = sim_resolve_stream(stream, mode, &s);
    if (rc != CUDA_SUCCESS)
        return rc;
    CUgraph capture = sim_stream_capture(s);
    if (capture != NULL) /* captured: a free node of a graph allocation */
        return sim_graph_capture_free(capture, dptr);
    pthread_mutex_lock(&sim_cuda.mu);
    struct sim_alloc_rec *rec = sim_find_alloc((uintptr_t)dptr);
    rc = CUDA_ERROR_INVALID_VALUE;
    if (rec != NULL && rec->kind == ALLOC_POOL) {
        sim_pool_return_block(rec);
        rc = CUDA_SUCCESS;
    } else if (rec != NULL && rec->kind == ALLOC_GRAPH) {
        sim_graph_mem_free(rec);
        rc = CUDA_SUCCESS;
    }
    pthread_mutex_unlock(&sim_cuda.mu);
    return rc;
}

SIMGPU_API CUresult cuMemFreeAsync(CUdeviceptr dptr, CUstream stream)
{
    return free_async(dptr, stream, SIM_LEGACY);
}

SIMGPU_API CUresult cuMemFreeAsync_ptsz(CUdeviceptr dptr, CUstream stream)
{
    return free_async(dptr, stream, SIM_PER_THREAD);
}

/* A pool's memory location and allocation type (CUDA 13.0 also names pools by them). The
 * simulator has pools of device memory only: a pinned-type device location is a device's pool;
 * host, NUMA and managed pools are CUDA_ERROR_NOT_SUPPORTED, as on a driver or device without
 * them. */
static CUresult located_device(const CUmemLocation *location, CUmemAllocationType type,
                               CUdevice *dev)
{
    if (location == NULL ||
        (type != CU_MEM_ALLOCATION_TYPE_PINNED && type != CU_MEM_ALLOCATION_TYPE_MANAGED))
        return CUDA_ERROR_INVALID_VALUE;
    switch (location->type) {
    case CU_MEM_LOCATION_TYPE_DEVICE:
        break;
    case CU_MEM_LOCATION_TYPE_HOST:
    case CU_MEM_LOCATION_TYPE_HOST_NUMA:
    case CU_MEM_LOCATION_TYPE_HOST_NUMA_CURRENT:
        return CUDA_ERROR_NOT_SUPPORTED;
    default:
        return CUDA_ERROR_INVALID_VALUE;
    }
    if (type == CU_MEM_ALLOCATION_TYPE_MANAGED)
        return CUDA_ERROR_NOT_SUPPORTED;
    *dev = location->id;
    return CUDA_SUCCESS;
}

SIMGPU_API CUresult cuMemPoolCreate(CUmemoryPool *pool, const CUmemPoolProps *props)
{
    SIM_ENTER();
    if (pool == NULL || props == NULL ||
        (props->handleTypes != CU_MEM_HANDLE_TYPE_NONE &&
         props->handleTypes != CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR))
        return CUDA_ERROR_INVALID_VALUE;
    CUdevice dev = 0;
    CUresult rc = located_device(&props->location, props->allocType, &dev);
    if (rc != CUDA_SUCCESS)
        return rc;
    rc = sim_check_device(dev);
    if (rc != CUDA_SUCCESS)
        return rc == CUDA_ERROR_INVALID_DEVICE ? CUDA_ERROR_INVALID_VALUE : rc;
    CUmemoryPool p = calloc(1, sizeof *p);
    if (p == NULL)
        return CUDA_ERROR_OUT_OF_MEMORY;
    p->tag = TAG_POOL;
    p->device = dev;
    for (int i = 1; i <= 3; i++)
        p->reuse_flags[i] = 1;
    *pool = p;
    return CUDA_SUCCESS;
}

SIMGPU_API CUresult cuMemPoolDestroy(CUmemoryPool pool)
{
    SIM_ENTER();
    pthread_mutex_lock(&sim_cuda.mu);
    CUresult rc = CUDA_ERROR_INVALID_VALUE;
    if (pool_valid(pool) && pool != &default_pools[pool->device]) {
        trim(pool, 0);
        if (current_pools[pool->device] == pool)
            current_pools[pool->device] = NULL;
        /* Outstanding allocations still point at the pool, so the struct is kept; only the
         * handle becomes invalid. */
        pool->tag = 0;
        rc = CUDA_SUCCESS;
    }
    pthread_mutex_unlock(&sim_cuda.mu);
    return rc;
}

SIMGPU_API CUresult cuMemPoolTrimTo(CUmemoryPool pool, size_t minBytesToKeep)
{
    SIM_ENTER();
    pthread_mutex_lock(&sim_cuda.mu);
    CUresult rc = CUDA_ERROR_INVALID_VALUE;
    if (pool_valid(pool)) {
        trim(pool, minBytesToKeep);
        rc = CUDA_SUCCESS;
    }
    pthread_mutex_unlock(&sim_cuda.mu);
    return rc;
}

SIMGPU_API CUresult cuMemPoolSetAttribute(CUmemoryPool pool, CUmemPool_attribute attr, void *value)
{
    SIM_ENTER();
    if (value == NULL)
        return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&sim_cuda.mu);
    CUresult rc = pool_valid(pool) ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
    if (rc == CUDA_SUCCESS) {
        switch (attr) {
        case CU_MEMPOOL_ATTR_REUSE_FOLLOW_EVENT_DEPENDENCIES:
        case CU_MEMPOOL_ATTR_REUSE_ALLOW_OPPORTUNISTIC:
        case CU_MEMPOOL_ATTR_REUSE_ALLOW_INTERNAL_DEPENDENCIES:
            pool->reuse_flags[attr] = *(int *)value;
            break;
        case CU_MEMPOOL_ATTR_RELEASE_THRESHOLD:
            pool->release_threshold = *(cuuint64_t *)value;
            break;
        case CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH:
        case CU_MEMPOOL_ATTR_USED_MEM_HIGH:
            /* Only resetting the high-water marks to zero is allowed. */
            if (*(cuuint64_t *)value != 0)
                rc = CUDA_ERROR_INVALID_VALUE;
            else if (attr == CU_MEMPOOL_ATTR_USED_MEM_HIGH)
                pool->used_high = pool->used;
            else
                pool->reserved_high = pool->reserved;
            break;
        default:
            rc = CUDA_ERROR_INVALID_VALUE;
        }
    }
    pthread_mutex_unlock(&sim_cuda.mu);
    return rc;
}

SIMGPU_API CUresult cuMemPoolGetAttribute(CUmemoryPool pool, CUmemPool_attribute attr, void *value)
{
    SIM_ENTER();
    if (value == NULL)
        return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&sim_cuda.mu);
    CUresult rc = pool_valid(pool) ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
    if (rc == CUDA_SUCCESS) {
        switch (attr) {
        case CU_MEMPOOL_ATTR_REUSE_FOLLOW_EVENT_DEPENDENCIES:
        case CU_MEMPOOL_ATTR_REUSE_ALLOW_OPPORTUNISTIC:
        case CU_MEMPOOL_ATTR_REUSE_ALLOW_INTERNAL_DEPENDENCIES:
            *(int *)value = pool->reuse_flags[attr];
            break;
        case CU_MEMPOOL_ATTR_RELEASE_THRESHOLD:
            *(cuuint64_t *)value = pool->release_threshold;
            break;
        case CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT:
            *(cuuint64_t *)value = pool->reserved;
            break;
        case CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH:
            *(cuuint64_t *)value = pool->reserved_high;
            break;
        case CU_MEMPOOL_ATTR_USED_MEM_CURRENT:
            *(cuuint64_t *)value = pool->used;
            break;
        case CU_MEMPOOL_ATTR_USED_MEM_HIGH:
            *(cuuint64_t *)value = pool->used_high;
            break;
        default:
            rc = CUDA_ERROR_INVALID_VALUE;
        }
    }
    pthread_mutex_unlock(&sim_cuda.mu);
    return rc;
}

SIMGPU_API CUresult cuDeviceGetDefaultMemPool(CUmemoryPool *pool, CUdevice dev)
{
    SIM_ENTER();
    if (pool == NULL)
        return CUDA_ERROR_INVALID_VALUE;
    if (dev < 0 || dev >= sim_cuda.rt.cfg.gpu_count)
        return CUDA_ERROR_INVALID_DEVICE;
    pthread_mutex_lock(&sim_cuda.mu);
    *pool = default_pool(dev);
    pthread_mutex_unlock(&sim_cuda.mu);
    return CUDA_SUCCESS;
}

SIMGPU_API CUresult cuDeviceGetMemPool(CUmemoryPool *pool, CUdevice dev)
{
    SIM_ENTER();
    if (pool == NULL)
        return CUDA_ERROR_INVALID_VALUE;
    if (dev < 0 || dev >= sim_cuda.rt.cfg.gpu_count)
        return CUDA_ERROR_INVALID_DEVICE;
    pthread_mutex_lock(&sim_cuda.mu);
    *pool = current_pool(dev);
    pthread_mutex_unlock(&sim_cuda.mu);
    return CUDA_SUCCESS;
}

SIMGPU_API CUresult cuDeviceSetMemPool(CUdevice dev, CUmemoryPool pool)
{
    SIM_ENTER();
    if (dev < 0 || dev >= sim_cuda.rt.cfg.gpu_count)
        return CUDA_ERROR_INVALID_DEVICE;
    pthread_mutex_lock(&sim_cuda.mu);
    CUresult rc = CUDA_ERROR_INVALID_VALUE;
    if (pool_valid(pool) && pool->device == dev) {
        current_pools[dev] = pool;
        rc = CUDA_SUCCESS;
    }
    pthread_mutex_unlock(&sim_cuda.mu);
    return rc;
}

SIMGPU_API CUresult cuMemGetDefaultMemPool(CUmemoryPool *pool, CUmemLocation *location,
                                           CUmemAllocationType type)
{
    CUdevice dev = 0;
    CUresult rc = located_device(location, type, &dev);
    return rc != CUDA_SUCCESS ? rc : cuDeviceGetDefaultMemPool(pool, dev);
}

SIMGPU_API CUresult cuMemGetMemPool(CUmemoryPool *pool, CUmemLocation *location,
                                    CUmemAllocationType type)
{
    CUdevice dev = 0;
    CUresult rc = located_device(location, type, &dev);
    return rc != CUDA_SUCCESS ? rc : cuDeviceGetMemPool(pool, dev);
}

SIMGPU_API CUresult cuMemSetMemPool(CUmemLocation *location, CUmemAllocationType type,
                                    CUmemoryPool pool)
{
    CUdevice dev = 0;
    CUresult rc = located_device(location, type, &dev);
    return rc != CUDA_SUCCESS ? rc : cuDeviceSetMemPool(dev, pool);
}
