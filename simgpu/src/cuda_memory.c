/* Device, managed and pinned-host allocation; copies and memsets; memory info. */
#include "cuda_memory.h"

#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "devmem.h"

static struct sim_alloc_rec *allocations;

static size_t round_up(size_t v, size_t unit)
{
    return (v + unit - 1) / unit * unit;
}

void *sim_backing_map(size_t bytes)
{
    void *map = mmap(NULL, bytes, PROT_READ | PROT_WRITE,
                     MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    return map == MAP_FAILED ? NULL : map;
}

CUresult sim_alloc(CUcontext ctx, size_t bytes, enum sim_alloc_kind kind,
                   struct sim_alloc_rec **out)
{
    struct sim_alloc_rec *rec = calloc(1, sizeof *rec);
    if (rec == NULL)
        return CUDA_ERROR_OUT_OF_MEMORY;
    if (kind != ALLOC_HOST) {
        CUresult rc = sim_devmem_reserve(ctx->device, round_up(bytes, SIM_ALLOC_ROUNDING),
                                         &rec->handle);
        if (rc != CUDA_SUCCESS) {
            free(rec);
            return rc;
        }
    }
    void *map = sim_backing_map(bytes);
    if (map == NULL) {
        if (kind != ALLOC_HOST)
            sim_mem_release(&sim_cuda.rt.node, rec->handle);
        free(rec);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    rec->base = (uintptr_t)map;
    rec->size = bytes;
    rec->ctx = ctx;
    rec->kind = kind;
    pthread_mutex_lock(&sim_cuda.mu);
    sim_link_alloc(rec);
    pthread_mutex_unlock(&sim_cuda.mu);
    *out = rec;
    return CUDA_SUCCESS;
}

void sim_link_alloc(struct sim_alloc_rec *rec)
{
    rec->buffer_id = 0; /* a pool block handed out again is a new buffer */
    rec->next = allocations;
    allocations = rec;
}

void sim_unlink_alloc(struct sim_alloc_rec *rec)
{
    for (struct sim_alloc_rec **link = &allocations; *link != NULL; link = &(*link)->next) {
        if (*link == rec) {
            *link = rec->next;
            return;
        }
    }
}

void sim_free_rec(struct sim_alloc_rec *rec)
{
    sim_unlink_alloc(rec);
    munmap((void *)rec->base, rec->size);
    if (rec->exported)
        sim_ipc_forget(rec);
    if (rec->kind != ALLOC_HOST && rec->kind != ALLOC_POOL && rec->kind != ALLOC_IPC)
        sim_mem_release(&sim_cuda.rt.node, rec->handle);
    free(rec);
}

struct sim_alloc_rec *sim_first_alloc(void)
{
    return allocations;
}

struct sim_alloc_rec *sim_find_alloc(uintptr_t ptr)
{
    for (struct sim_alloc_rec *r = allocations; r != NULL; r = r->next) {
        if (r->base == ptr)
            return r;
    }
    return NULL;
}

struct sim_alloc_rec *sim_find_containing(uintptr_t ptr)
{
    for (struct sim_alloc_rec *r = allocations; r != NULL; r = r->next) {
        if (ptr >= r->base && ptr < r->base + r->size)
            return r;
    }
    return NULL;
}

bool sim_device_range_valid(uintptr_t ptr, size_t bytes)
{
    pthread_mutex_lock(&sim_cuda.mu);
    const struct sim_alloc_rec *r = sim_find_containing(ptr);
    bool ok = (r != NULL && r->kind != ALLOC_HOST && bytes <= r->base + r->size - ptr) ||
              sim_vmm_range_mapped(ptr, bytes);
    pthread_mutex_unlock(&sim_cuda.mu);
    return ok;
}

void sim_memory_release_context(CUcontext ctx)
{
    struct sim_alloc_rec *r = allocations;
    while (r != NULL) {
        struct sim_alloc_rec *next = r->next;
        if (r->ctx == ctx && r->kind == ALLOC_GRAPH) {
            sim_graph_mem_free(r); /* to the graph memory cache, which outlives contexts */
        } else if (r->ctx == ctx) {
            if (r->kind == ALLOC_POOL)
                sim_pool_forget(r);
            sim_free_rec(r);
        }
        r = next;
    }
}

SIMGPU_API CUresult cuMemAlloc_v2(CUdeviceptr *dptr, size_t bytesize)
{
    SIM_ENTER();
    if (dptr == NULL || bytesize == 0)
        return CUDA_ERROR_INVALID_VALUE;
    CUcontext ctx = NULL;
    CUresult rc = sim_require_ctx(&ctx);
    struct sim_alloc_rec *rec = NULL;
    if (rc == CUDA_SUCCESS)
        rc = sim_alloc(ctx, bytesize, ALLOC_DEVICE, &rec);
    if (rc == CUDA_SUCCESS)
        *dptr = rec->base;
    return rc;
}

SIMGPU_API CUresult cuMemAllocPitch_v2(CUdeviceptr *dptr, size_t *pitch, size_t widthInBytes,
                                       size_t height, unsigned int elementSizeBytes)
{
    SIM_ENTER();
    if (dptr == NULL || pitch == NULL || widthInBytes == 0 || height == 0 ||
        (elementSizeBytes != 4 && elementSizeBytes != 8 && elementSizeBytes != 16))
        return CUDA_ERROR_INVALID_VALUE;
    size_t row = round_up(widthInBytes, 512); /* the texture pitch alignment */
    if (height > SIZE_MAX / row)
        return CUDA_ERROR_OUT_OF_MEMORY;
    CUcontext ctx = NULL;
    CUresult rc = sim_require_ctx(&ctx);
    struct sim_alloc_rec *rec = NULL;
    if (rc == CUDA_SUCCESS)
        rc = sim_alloc(ctx, row * height, ALLOC_DEVICE, &rec);
    if (rc == CUDA_SUCCESS) {
        *dptr = rec->base;
        *pitch = row;
    }
    return rc;
}

SIMGPU_API CUresult cuMemAllocManaged(CUdeviceptr *dptr, size_t bytesize, unsigned int flags)
{
    SIM_ENTER();
    if (dptr == NULL || bytesize == 0 ||
        (flags != CU_MEM_ATTACH_GLOBAL && flags != CU_MEM_ATTACH_HOST))
        return CUDA_ERROR_INVALID_VALUE;
    CUcontext ctx = NULL;
    CUresult rc = sim_require_ctx(&ctx);
    struct sim_alloc_rec *rec = NULL;
    if (rc == CUDA_SUCCESS)
        rc = sim_alloc(ctx, bytesize, ALLOC_MANAGED, &rec);
    if (rc == CUDA_SUCCESS)
        *dptr = rec->base;
    return rc;
}

SIMGPU_API CUresult cuMemAllocHost_v2(void **pp, size_t bytesize)
{
    SIM_ENTER();
    if (pp == NULL || bytesize == 0)
        return CUDA_ERROR_INVALID_VALUE;
    CUcontext ctx = NULL;
    CUresult rc = sim_require_ctx(&ctx);
    struct sim_alloc_rec *rec = NULL;
    if (rc == CUDA_SUCCESS)
        rc = sim_alloc(ctx, bytesize, ALLOC_HOST, &rec);
    if (rc == CUDA_SUCCESS)
        *pp = (void *)rec->base;
    return rc;
}

static CUresult free_kind(uintptr_t ptr, bool host)
{
    pthread_mutex_lock(&sim_cuda.mu);
    struct sim_alloc_rec *rec = sim_find_alloc(ptr);
    CUresult rc = CUDA_ERROR_INVALID_VALUE;
    if (rec != NULL && rec->kind == ALLOC_POOL && !host) {
        sim_pool_return_block(rec); /* a stream-ordered allocation: to its pool, as CUDA does */
        rc = CUDA_SUCCESS;
    } else if (rec != NULL && rec->kind == ALLOC_GRAPH && !host) {
        sim_graph_mem_free(rec); /* a graph allocation: to the device's graph memory cache */
        rc = CUDA_SUCCESS;
    } else if (rec != NULL && rec->kind != ALLOC_IPC && (rec->kind == ALLOC_HOST) == host) {
        sim_free_rec(rec);
        rc = CUDA_SUCCESS;
    }
    pthread_mutex_unlock(&sim_cuda.mu);
    return rc;
}

SIMGPU_API CUresult cuMemFree_v2(CUdeviceptr dptr)
{
    SIM_ENTER();
    return free_kind((uintptr_t)dptr, false);
}

SIMGPU_API CUresult cuMemFreeHost(void *p)
{
    SIM_ENTER();
    return free_kind((uintptr_t)p, true);
}

SIMGPU_API CUresult cuMemGetAddressRange_v2(CUdeviceptr *pbase, size_t *psize, CUdeviceptr dptr)
{
    SIM_ENTER();
    pthread_mutex_lock(&sim_cuda.mu);
    const struct sim_alloc_rec *rec = sim_find_containing((uintptr_t)dptr);
    CUresult rc = CUDA_ERROR_NOT_FOUND;
    if (rec != NULL && rec->kind != ALLOC_HOST) {
        if (pbase != NULL)
            *pbase = rec->base;
        if (psize != NULL)
            *psize = rec->size;
        rc = CUDA_SUCCESS;
    }
    pthread_mutex_unlock(&sim_cuda.mu);
    return rc;
}

SIMGPU_API CUresult cuMemGetInfo_v2(size_t *free_bytes, size_t *total_bytes)
{
    SIM_ENTER();
    if (free_bytes == NULL || total_bytes == NULL)
        return CUDA_ERROR_INVALID_VALUE;
    CUcontext ctx = NULL;
    CUresult rc = sim_require_ctx(&ctx);
    if (rc != CUDA_SUCCESS)
        return rc;
    struct sim_node *node = &sim_cuda.rt.node;
    uint64_t total = sim_cuda.rt.cfg.gpus[ctx->device].memory_bytes;
    sim_node_lock(node);
    sim_node_reap(node);
    uint64_t used = sim_mem_used_locked(node, sim_node_mem(ctx->device));
    sim_node_unlock(node);
    *total_bytes = (size_t)total;
    *free_bytes = (size_t)(used < total ? total - used : 0);
    return CUDA_SUCCESS;
}

/*
 * Copies and memsets: data moves at once and takes no device time. The synchronous forms first
 * wait for the default stream's queued work: for the legacy default stream, everything queued in
 * the context (it synchronises with the other streams); for the per-thread default stream (the
 * _ptds entry points), only the calling thread's own.
 */
static CUresult wait_default_stream(CUcontext ctx, enum sim_default_stream mode)
{
    if (mode == SIM_LEGACY)
        return sim_ctx_wait(ctx);
    struct CUstream_st *s = NULL;
    CUresult rc = sim_resolve_stream(NULL, mode, &s);
    return rc == CUDA_SUCCESS ? sim_stream_wait(s) : rc;
}

/* `sync`: a synchronous form, else an async one queued on `stream`. */
static CUresult copy(void *dst, const void *src, size_t bytes, bool dst_dev, bool src_dev,
                     CUstream stream, bool sync, enum sim_default_stream mode)
{
    SIM_ENTER();
    CUcontext ctx = NULL;
    CUresult rc = sim_require_ctx(&ctx);
    if (rc != CUDA_SUCCESS)
        return rc;
    if (bytes == 0)
        return CUDA_SUCCESS;
    if (dst == NULL || src == NULL || (dst_dev && !sim_device_range_valid((uintptr_t)dst, bytes)) ||
        (src_dev && !sim_device_range_valid((uintptr_t)src, bytes)))
        return CUDA_ERROR_INVALID_VALUE;
    struct CUstream_st *s = NULL;
    if (!sync && (rc = sim_resolve_stream(stream, mode, &s)) != CUDA_SUCCESS)
        return rc;
    if (sync && (rc = wait_default_stream(ctx, mode)) != CUDA_SUCCESS)
        return rc;
    memmove(dst, src, bytes);
    return CUDA_SUCCESS;
}

SIMGPU_API CUresult cuMemcpyHtoD_v2(CUdeviceptr dst, const void *src, size_t bytes)
{
    return copy((void *)dst, src, bytes, true, false, NULL, true, SIM_LEGACY);
}

SIMGPU_API CUresult cuMemcpyHtoD_v2_ptds(CUdeviceptr dst, const void *src, size_t bytes)
{
    return copy((void *)dst, src, bytes, true, false, NULL, true, SIM_PER_THREAD);
}

SIMGPU_API CUresult cuMemcpyDtoH_v2(void *dst, CUdeviceptr src, size_t bytes)
{
    return copy(dst, (const void *)src, bytes, false, true, NULL, true, SIM_LEGACY);
}

SIMGPU_API CUresult cuMemcpyDtoH_v2_ptds(void *dst, CUdeviceptr src, size_t bytes)
{
    return copy(dst, (const void *)src, bytes, false, true, NULL, true, SIM_PER_THREAD);
}

SIMGPU_API CUresult cuMemcpyDtoD_v2(CUdeviceptr dst, CUdeviceptr src, size_t bytes)
{
    return copy((void *)dst, (const void *)src, bytes, true, true, NULL, true, SIM_LEGACY);
}

SIMGPU_API CUresult cuMemcpyDtoD_v2_ptds(CUdeviceptr dst, CUdeviceptr src, size_t bytes)
{
    return copy((void *)dst, (const void *)src, bytes, true, true, NULL, true, SIM_PER_THREAD);
}

/* Unified addressing: either side may be host or device memory. */
SIMGPU_API CUresult cuMemcpy(CUdeviceptr dst, CUdeviceptr src, size_t bytes)
{
    return copy((void *)dst, (const void *)src, bytes, false, false, NULL, true, SIM_LEGACY);
}

SIMGPU_API CUresult cuMemcpy_ptds(CUdeviceptr dst, CUdeviceptr src, size_t bytes)
{
    return copy((void *)dst, (const void *)src, bytes, false, false, NULL, true, SIM_PER_THREAD);
}

SIMGPU_API CUresult cuMemcpyHtoDAsync_v2(CUdeviceptr dst, const void *src, size_t bytes,
                                         CUstream stream)
{
    return copy((void *)dst, src, bytes, true, false, stream, false, SIM_LEGACY);
}

SIMGPU_API CUresult cuMemcpyHtoDAsync_v2_ptsz(CUdeviceptr dst, const void *src, size_t bytes,
                                              CUstream stream)
{
    return copy((void *)dst, src, bytes, true, false, stream, false, SIM_PER_THREAD);
}

SIMGPU_API CUresult cuMemcpyDtoHAsync_v2(void *dst, CUdeviceptr src, size_t bytes,
                                         CUstream stream)
{
    return copy(dst, (const void *)src, bytes, false, true, stream, false, SIM_LEGACY);
}

SIMGPU_API CUresult cuMemcpyDtoHAsync_v2_ptsz(void *dst, CUdeviceptr src, size_t bytes,
                                              CUstream stream)
{
    return copy(dst, (const void *)src, bytes, false, true, stream, false, SIM_PER_THREAD);
}

SIMGPU_API CUresult cuMemcpyAsync(CUdeviceptr dst, CUdeviceptr src, size_t bytes, CUstream stream)
{
    return copy((void *)dst, (const void *)src, bytes, false, false, stream, false, SIM_LEGACY);
}

SIMGPU_API CUresult cuMemcpyAsync_ptsz(CUdeviceptr dst, CUdeviceptr src, size_t bytes,
                                       CUstream stream)
{
    return copy((void *)dst, (const void *)src, bytes, false, false, stream, false, SIM_PER_THREAD);
}

static CUresult memset_n(CUdeviceptr dst, uint32_t value, unsigned int width, size_t count,
                         CUstream stream, bool sync, enum sim_default_stream mode)
{
    SIM_ENTER();
    CUcontext ctx = NULL;
    CUresult rc = sim_require_ctx(&ctx);
    if (rc != CUDA_SUCCESS)
        return rc;
    if (count == 0)
        return CUDA_SUCCESS;
    if (dst % width != 0 || count > SIZE_MAX / width ||
        !sim_device_range_valid((uintptr_t)dst, count * width))
        return CUDA_ERROR_INVALID_VALUE;
    struct CUstream_st *s = NULL;
    if (!sync && (rc = sim_resolve_stream(stream, mode, &s)) != CUDA_SUCCESS)
        return rc;
    if (sync && (rc = wait_default_stream(ctx, mode)) != CUDA_SUCCESS)
        return rc;
    if (width == 1) {
        memset((void *)dst, (int)value, count);
    } else {
        uint32_t *p = (uint32_t *)dst;
        for (size_t i = 0; i < count; i++)
            p[i] = value;
    }
    return CUDA_SUCCESS;
}

SIMGPU_API CUresult cuMemsetD8_v2(CUdeviceptr dst, unsigned char value, size_t count)
{
    return memset_n(dst, value, 1, count, NULL, true, SIM_LEGACY);
}

SIMGPU_API CUresult cuMemsetD8_v2_ptds(CUdeviceptr dst, unsigned char value, size_t count)
{
    return memset_n(dst, value, 1, count, NULL, true, SIM_PER_THREAD);
}

SIMGPU_API CUresult cuMemsetD32_v2(CUdeviceptr dst, unsigned int value, size_t count)
{
    return memset_n(dst, value, 4, count, NULL, true, SIM_LEGACY);
}

SIMGPU_API CUresult cuMemsetD32_v2_ptds(CUdeviceptr dst, unsigned int value, size_t count)
{
    return memset_n(dst, value, 4, count, NULL, true, SIM_PER_THREAD);
}

SIMGPU_API CUresult cuMemsetD8Async(CUdeviceptr dst, unsigned char value, size_t count,
                                    CUstream stream)
{
    return memset_n(dst, value, 1, count, stream, false, SIM_LEGACY);
}

SIMGPU_API CUresult cuMemsetD8Async_ptsz(CUdeviceptr dst, unsigned char value, size_t count,
                                         CUstream stream)
{
    return memset_n(dst, value, 1, count, stream, false, SIM_PER_THREAD);
}

SIMGPU_API CUresult cuMemsetD32Async(CUdeviceptr dst, unsigned int value, size_t count,
                                     CUstream stream)
{
    return memset_n(dst, value, 4, count, stream, false, SIM_LEGACY);
}

SIMGPU_API CUresult cuMemsetD32Async_ptsz(CUdeviceptr dst, unsigned int value, size_t count,
                                          CUstream stream)
{
    return memset_n(dst, value, 4, count, stream, false, SIM_PER_THREAD);
}
