/*
 * Stream-ordered allocation and memory pools. As on a GPU, memory freed with cuMemFreeAsync is
 * not returned to the device at once: it stays reserved in its pool (visible to cuMemGetInfo and
 * NVML) for reuse, and is released at the next synchronisation down to the pool's release
 * threshold (0 by default), or by cuMemPoolTrimTo.
 */
#include <stdlib.h>
#include <string.h>

#include "cuda_memory.h"

struct CUmemPoolHandle_st {
    uint32_t tag;
    CUdevice device;
    uint64_t release_threshold;
    int reuse_flags[4]; /* the three REUSE_* attributes, indexed by attribute number */
    uint64_t used, used_high;
    uint64_t cached; /* freed but still reserved */
    uint64_t reserved_high;
    struct sim_alloc_rec *free_list; /* freed blocks, unlinked from the allocation registry */
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

/* Release cached blocks until the pool reserves at most `keep` bytes (its allocations count:
 * what is in use cannot be released), as cuMemPoolTrimTo and the release threshold are defined.
 * Needs mu. */
static void trim(CUmemoryPool pool, uint64_t keep)
{
    while (pool->used + pool->cached > keep && pool->free_list != NULL) {
        struct sim_alloc_rec *rec = pool->free_list;
        pool->free_list = rec->next;
        pool->cached -= rec->size;
        rec->next = NULL;
        /* Not in the registry any more: sim_free_rec just unmaps and gives the bytes back. */
        sim_free_rec(rec);
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

void sim_pool_forget(CUmemoryPool pool, size_t bytes)
{
    pool->used -= bytes;
}

void sim_pools_release_context(CUcontext ctx)
{
    /* Blocks belong to pools, which outlive contexts; a context going away is a sync point. */
    if (default_pools[ctx->device].tag == TAG_POOL)
        trim(&default_pools[ctx->device], 0);
    if (current_pools[ctx->device] != NULL)
        trim(current_pools[ctx->device], 0);
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
    pthread_mutex_lock(&sim_cuda.mu);
    if (pool == NULL)
        pool = current_pool(s->ctx->device);
    if (!pool_valid(pool) || pool->device != s->ctx->device) {
        pthread_mutex_unlock(&sim_cuda.mu);
        return CUDA_ERROR_INVALID_VALUE;
    }
    /* Reuse a cached block of exactly this size before asking the device for more. */
    struct sim_alloc_rec *rec = NULL;
    for (struct sim_alloc_rec **link = &pool->free_list; *link != NULL; link = &(*link)->next) {
        if ((*link)->size == bytes) {
            rec = *link;
            *link = rec->next;
            pool->cached -= bytes;
            rec->ctx = s->ctx;
            sim_link_alloc(rec);
            break;
        }
    }
    pthread_mutex_unlock(&sim_cuda.mu);
    if (rec == NULL) {
        rc = sim_alloc(s->ctx, bytes, ALLOC_POOL, pool, &rec);
        if (rc != CUDA_SUCCESS)
            return rc;
    }
    pthread_mutex_lock(&sim_cuda.mu);
    pool->used += bytes;
    if (pool->used > pool->used_high)
        pool->used_high = pool->used;
    if (pool->used + pool->cached > pool->reserved_high)
        pool->reserved_high = pool->used + pool->cached;
    pthread_mutex_unlock(&sim_cuda.mu);
    *dptr = rec->base;
    return CUDA_SUCCESS;
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

static CUresult free_async(CUdeviceptr dptr, CUstream stream, enum sim_default_stream mode)
{
    SIM_ENTER();
    struct CUstream_st *s = NULL;
    CUresult rc = sim_resolve_stream(stream, mode, &s);
    if (rc != CUDA_SUCCESS)
        return rc;
    pthread_mutex_lock(&sim_cuda.mu);
    struct sim_alloc_rec *rec = sim_find_alloc((uintptr_t)dptr);
    rc = CUDA_ERROR_INVALID_VALUE;
    if (rec != NULL && rec->kind == ALLOC_POOL) {
        CUmemoryPool pool = rec->pool;
        sim_unlink_alloc(rec);
        rec->next = pool->free_list;
        pool->free_list = rec;
        pool->used -= rec->size;
        pool->cached += rec->size;
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

SIMGPU_API CUresult cuMemPoolCreate(CUmemoryPool *pool, const CUmemPoolProps *props)
{
    SIM_ENTER();
    if (pool == NULL || props == NULL || props->allocType != CU_MEM_ALLOCATION_TYPE_PINNED ||
        props->location.type != CU_MEM_LOCATION_TYPE_DEVICE ||
        (props->handleTypes != CU_MEM_HANDLE_TYPE_NONE &&
         props->handleTypes != CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR))
        return CUDA_ERROR_INVALID_VALUE;
    CUresult rc = sim_check_device(props->location.id);
    if (rc != CUDA_SUCCESS)
        return rc == CUDA_ERROR_INVALID_DEVICE ? CUDA_ERROR_INVALID_VALUE : rc;
    CUmemoryPool p = calloc(1, sizeof *p);
    if (p == NULL)
        return CUDA_ERROR_OUT_OF_MEMORY;
    p->tag = TAG_POOL;
    p->device = props->location.id;
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
                pool->reserved_high = pool->used + pool->cached;
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
            *(cuuint64_t *)value = pool->used + pool->cached;
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
