/*
 * CUDA entry points that take, give back or report device memory. Allocations reserve their
 * bytes in the usage region before the real call and return them if it fails (after trying
 * again for a while when the GPU had no memory for what the claim has room for:
 * shim_charge_retry); frees look the pointer up in the O(1) table, remove it before the real call
 * (so a concurrent allocation that gets the same address cannot be confused with it) and give the
 * bytes back only if the driver freed. keylock.h orders frees of one key, and stale frees with allocations in flight, so that
 * the refund follows the driver's answer whichever of several racing calls gets it. Pointers the
 * shim did not charge (allocated while unlimited, imported, ...) pass through.
 */
#include <string.h>

#include "capture.h"
#include "keylock.h"
#include "log.h"
#include "memory.h"
#include "pools.h"
#include "shim_state.h"

/* What the real driver rounds small allocations to; used only to estimate a pitch. */
#define PITCH_ALIGN 512ULL

#define REAL_OR_NOT_FOUND(name)                                                                   \
    do {                                                                                          \
        shim_init();                                                                              \
        if (shim_real.name == NULL)                                                               \
            return CUDA_ERROR_NOT_FOUND;                                                          \
    } while (0)

static inline uint64_t key_of(CUdeviceptr p)
{
    return (uint64_t)p;
}

/* ------------------------------------------------------------------ allocation ---------- */

/* Each allocation's real call again, for shim_charge_retry: its arguments and a function that
 * makes the call with them. */
struct alloc_call {
    CUdeviceptr *dptr;
    size_t bytesize;
};

static __attribute__((cold)) CUresult call_alloc(void *p)
{
    struct alloc_call *a = p;
    return shim.calls.cuMemAlloc_v2(a->dptr, a->bytesize);
}

/* Out of line: its argument block is not in the frame of every allocation. */
static __attribute__((noinline, cold)) CUresult alloc_again(struct shim_charge *c,
                                                            CUdeviceptr *dptr, size_t bytesize)
{
    struct alloc_call a = {dptr, bytesize};
    return shim_charge_retry(c, call_alloc, &a);
}

SHIM_EXPORT CUresult cuMemAlloc_v2(CUdeviceptr *dptr, size_t bytesize)
{
    struct shim_charge c;
    CUresult rc = shim_charge_begin(&c, -1, bytesize);
    if (rc != CUDA_SUCCESS)
        return rc;
    rc = shim.calls.cuMemAlloc_v2(dptr, bytesize);
    if (SHIM_UNLIKELY(rc == CUDA_ERROR_OUT_OF_MEMORY))
        rc = alloc_again(&c, dptr, bytesize);
    if (rc == CUDA_SUCCESS)
        shim_charge_commit(&c, SHIM_KIND_DEVICE, key_of(*dptr));
    else
        shim_charge_abort(&c);
    return rc;
}

struct pitch_call {
    CUdeviceptr *dptr;
    size_t *pitch;
    size_t width;
    size_t height;
    unsigned int element;
};

static __attribute__((cold)) CUresult call_pitch(void *p)
{
    struct pitch_call *a = p;
    return shim_real.cuMemAllocPitch_v2(a->dptr, a->pitch, a->width, a->height, a->element);
}

SHIM_EXPORT CUresult cuMemAllocPitch_v2(CUdeviceptr *dptr, size_t *pitch, size_t widthInBytes,
                                        size_t height, unsigned int elementSizeBytes)
{
    /* The pitch is known only afterwards: reserve the usual padding, then settle on the real
     * size (refusing the allocation if the driver padded beyond what the claim has left). */
    uint64_t row = (widthInBytes + PITCH_ALIGN - 1) / PITCH_ALIGN * PITCH_ALIGN;
    struct shim_charge c;
    CUresult rc = shim_charge_begin(&c, -1, row * height);
    if (rc != CUDA_SUCCESS)
        return rc;
    rc = shim_real.cuMemAllocPitch_v2(dptr, pitch, widthInBytes, height, elementSizeBytes);
    if (SHIM_UNLIKELY(rc == CUDA_ERROR_OUT_OF_MEMORY)) {
        struct pitch_call a = {dptr, pitch, widthInBytes, height, elementSizeBytes};
        rc = shim_charge_retry(&c, call_pitch, &a);
    }
    if (rc != CUDA_SUCCESS) {
        shim_charge_abort(&c);
        return rc;
    }
    if (!shim_charge_resize(&c, (uint64_t)*pitch * height)) {
        shim_real.cuMemFree_v2(*dptr);
        shim_charge_abort(&c);
        *dptr = 0;
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    shim_charge_commit(&c, SHIM_KIND_DEVICE, key_of(*dptr));
    return rc;
}

struct managed_call {
    CUdeviceptr *dptr;
    size_t bytesize;
    unsigned int flags;
};

static __attribute__((cold)) CUresult call_managed(void *p)
{
    struct managed_call *a = p;
    return shim_real.cuMemAllocManaged(a->dptr, a->bytesize, a->flags);
}

/* Managed memory can live on the device, so all of it counts against the limit. */
SHIM_EXPORT CUresult cuMemAllocManaged(CUdeviceptr *dptr, size_t bytesize, unsigned int flags)
{
    REAL_OR_NOT_FOUND(cuMemAllocManaged);
    struct shim_charge c;
    CUresult rc = shim_charge_begin(&c, -1, bytesize);
    if (rc != CUDA_SUCCESS)
        return rc;
    rc = shim_real.cuMemAllocManaged(dptr, bytesize, flags);
    if (SHIM_UNLIKELY(rc == CUDA_ERROR_OUT_OF_MEMORY)) {
        struct managed_call a = {dptr, bytesize, flags};
        rc = shim_charge_retry(&c, call_managed, &a);
    }
    if (rc == CUDA_SUCCESS)
        shim_charge_commit(&c, SHIM_KIND_DEVICE, key_of(*dptr));
    else
        shim_charge_abort(&c);
    return rc;
}

/* Charge `c` (begun for `bytesize` on its device) what the allocation from `pool` (NULL: the
 * device's current pool) can make the pool grow by, its size rounded up to a granule, before
 * the driver is called, so that the growth never takes the claim past its limit (pools.h). If
 * that does not fit, the process's pools give back what they cache and it is tried again. Returns false (the charge aborted) if
 * the claim cannot take it; `*pool` is the pool charged for. */
static bool charge_growth(struct shim_charge *c, CUmemoryPool *pool, size_t bytesize)
{
    if (c->gpu < 0)
        return true;
    if (*pool == NULL) /* the pool the driver will allocate from */
        shim_real.cuDeviceGetMemPool(pool, c->device);
    if (shim_charge_resize(c, shim_pools_charge_for(bytesize)))
        return true;
    if (shim_pools_reclaim(c->device) && shim_charge_resize(c, shim_pools_charge_for(bytesize)))
        return true;
    SHIM_DEBUG("refused %zu bytes from memory pool %p on CUDA device %d: the pool would grow "
               "past the claim's limit", bytesize, (void *)*pool, c->device);
    shim_charge_abort(c);
    return false;
}

/* A stream-ordered allocation from `pool` (NULL: the current pool of the device of the current
 * context, as cuMemAllocAsync uses) on `stream`. Charged before the real call for what the pool
 * can grow by (charge_growth); then the pool is tracked and the device's cache charge settled:
 * its growth is taken from what was charged beyond the allocation, the rest refunded, and what
 * the driver served from the cache is refunded too. On a capturing stream it is a graph
 * allocation node, which takes no memory until its graph launches: passed through uncharged, the
 * graph is charged for it when instantiated (cuda_graph_hooks.c). */
static CUresult alloc_pooled(CUresult (*call)(void *), void *arg, CUdeviceptr *dptr,
                             size_t bytesize, CUmemoryPool pool, CUstream stream, bool ptsz)
{
    if (shim.memory_limited && shim_stream_capturing(stream, ptsz))
        return call(arg);
    struct shim_charge c;
    CUresult rc = shim_charge_begin(&c, pool != NULL ? shim_pools_device(pool) : -1, bytesize);
    if (rc != CUDA_SUCCESS)
        return rc;
    if (!charge_growth(&c, &pool, bytesize))
        return CUDA_ERROR_OUT_OF_MEMORY;
    rc = call(arg);
    if (SHIM_UNLIKELY(rc == CUDA_ERROR_OUT_OF_MEMORY))
        rc = shim_charge_retry(&c, call, arg);
    if (rc != CUDA_SUCCESS) {
        shim_charge_abort(&c);
        return rc;
    }
    if (c.gpu >= 0) {
        if (shim_pools_track(c.device, pool, false) != 0)
            SHIM_ERROR("more than %d memory pools on CUDA device %d: what pool %p caches is not "
                       "counted", SHIM_MAX_POOLS, c.device, (void *)pool);
        c.pool = shim_pools_allocated(c.device, pool);
        shim_charge_hand_over(&c, shim_pools_settle_growth(c.device, c.bytes - bytesize));
        shim_charge_resize(&c, bytesize); /* refunds what the growth did not take */
    }
    shim_charge_commit(&c, SHIM_KIND_DEVICE, key_of(*dptr));
    return rc;
}

struct alloc_args {
    CUdeviceptr *dptr;
    size_t bytesize;
    CUmemoryPool pool;
    CUstream stream;
    __typeof__(&cuMemAllocAsync) async;
    __typeof__(&cuMemAllocFromPoolAsync) from_pool;
};

static CUresult call_alloc_async(void *p)
{
    struct alloc_args *a = p;
    return a->async(a->dptr, a->bytesize, a->stream);
}

static CUresult call_alloc_from_pool(void *p)
{
    struct alloc_args *a = p;
    return a->from_pool(a->dptr, a->bytesize, a->pool, a->stream);
}

SHIM_EXPORT CUresult cuMemAllocAsync(CUdeviceptr *dptr, size_t bytesize, CUstream stream)
{
    REAL_OR_NOT_FOUND(cuMemAllocAsync);
    struct alloc_args a = {dptr, bytesize, NULL, stream, shim_real.cuMemAllocAsync, NULL};
    return alloc_pooled(call_alloc_async, &a, dptr, bytesize, NULL, stream, false);
}

SHIM_EXPORT CUresult cuMemAllocAsync_ptsz(CUdeviceptr *dptr, size_t bytesize, CUstream stream)
{
    REAL_OR_NOT_FOUND(cuMemAllocAsync_ptsz);
    struct alloc_args a = {dptr, bytesize, NULL, stream, shim_real.cuMemAllocAsync_ptsz, NULL};
    return alloc_pooled(call_alloc_async, &a, dptr, bytesize, NULL, stream, true);
}

SHIM_EXPORT CUresult cuMemAllocFromPoolAsync(CUdeviceptr *dptr, size_t bytesize,
                                             CUmemoryPool pool, CUstream stream)
{
    REAL_OR_NOT_FOUND(cuMemAllocFromPoolAsync);
    struct alloc_args a = {dptr, bytesize, pool, stream, NULL, shim_real.cuMemAllocFromPoolAsync};
    return alloc_pooled(call_alloc_from_pool, &a, dptr, bytesize, pool, stream, false);
}

SHIM_EXPORT CUresult cuMemAllocFromPoolAsync_ptsz(CUdeviceptr *dptr, size_t bytesize,
                                                  CUmemoryPool pool, CUstream stream)
{
    REAL_OR_NOT_FOUND(cuMemAllocFromPoolAsync_ptsz);
    struct alloc_args a = {dptr, bytesize, pool, stream, NULL,
                           shim_real.cuMemAllocFromPoolAsync_ptsz};
    return alloc_pooled(call_alloc_from_pool, &a, dptr, bytesize, pool, stream, true);
}

SHIM_EXPORT CUresult cuMemPoolCreate(CUmemoryPool *pool, const CUmemPoolProps *props)
{
    REAL_OR_NOT_FOUND(cuMemPoolCreate);
    CUresult rc = shim_real.cuMemPoolCreate(pool, props);
    if (rc == CUDA_SUCCESS && shim.memory_limited &&
        props->location.type == CU_MEM_LOCATION_TYPE_DEVICE &&
        shim_pools_track(props->location.id, *pool, true) != 0) {
        SHIM_DEBUG("cuMemPoolCreate refused: %d pools on CUDA device %d already",
                   SHIM_MAX_POOLS - 1, props->location.id);
        shim_real.cuMemPoolDestroy(*pool);
        *pool = NULL;
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    return rc;
}

SHIM_EXPORT CUresult cuMemPoolDestroy(CUmemoryPool pool)
{
    REAL_OR_NOT_FOUND(cuMemPoolDestroy);
    /* Allocations still out keep their charge until freed, and the pool's reservation beside
     * them stays counted until the last is: read while the pool can still be queried. */
    uint64_t free_before = shim_pools_free_of(pool);
    CUresult rc = shim_real.cuMemPoolDestroy(pool);
    if (rc == CUDA_SUCCESS)
        shim_pools_forget(pool, free_before);
    return rc;
}

SHIM_EXPORT CUresult cuMemPoolTrimTo(CUmemoryPool pool, size_t minBytesToKeep)
{
    REAL_OR_NOT_FOUND(cuMemPoolTrimTo);
    CUresult rc = shim_real.cuMemPoolTrimTo(pool, minBytesToKeep);
    if (rc == CUDA_SUCCESS)
        shim_pools_settle(shim_pools_device(pool));
    return rc;
}

/* VMM: physical memory is taken by cuMemCreate and given back when the handle is released and
 * every mapping of it is unmapped. The charge lives on an allocation record with a reference
 * per handle and per mapping; the handle value may be reused by the driver after release, so
 * it names the record only while valid. */
static uint64_t next_vmm_id = 1;

struct create_call {
    CUmemGenericAllocationHandle *handle;
    size_t size;
    const CUmemAllocationProp *prop;
    unsigned long long flags;
};

static __attribute__((cold)) CUresult call_create(void *p)
{
    struct create_call *a = p;
    return shim_real.cuMemCreate(a->handle, a->size, a->prop, a->flags);
}

SHIM_EXPORT CUresult cuMemCreate(CUmemGenericAllocationHandle *handle, size_t size,
                                 const CUmemAllocationProp *prop, unsigned long long flags)
{
    REAL_OR_NOT_FOUND(cuMemCreate);
    int dev = -1;
    if (prop != NULL && prop->location.type == CU_MEM_LOCATION_TYPE_DEVICE)
        dev = prop->location.id;
    struct shim_charge c;
    CUresult rc = shim_charge_begin(&c, dev, size);
    if (rc != CUDA_SUCCESS)
        return rc;
    rc = shim_real.cuMemCreate(handle, size, prop, flags);
    if (SHIM_UNLIKELY(rc == CUDA_ERROR_OUT_OF_MEMORY)) {
        struct create_call a = {handle, size, prop, flags};
        rc = shim_charge_retry(&c, call_create, &a);
    }
    if (rc != CUDA_SUCCESS) {
        shim_charge_abort(&c);
        return rc;
    }
    if (c.gated) {
        uint64_t id = __atomic_fetch_add(&next_vmm_id, 1, __ATOMIC_RELAXED);
        struct shim_entry h = {.key = *handle, .peer = id, .kind = SHIM_KIND_HANDLE, .gpu = -1};
        shim_table_put(&h);
        c.ctx = NULL; /* VMM memory is not owned by a context */
        shim_charge_commit(&c, SHIM_KIND_VMM, id);
    }
    return rc;
}

/* Memory another process exported (or this one, through a descriptor) is charged to whoever
 * created it: the imported handle is recorded as an allocation charged nothing, so that its
 * mappings, unmappings and release are known and give nothing back. */
SHIM_EXPORT CUresult cuMemImportFromShareableHandle(CUmemGenericAllocationHandle *handle,
                                                    void *osHandle,
                                                    CUmemAllocationHandleType shHandleType)
{
    REAL_OR_NOT_FOUND(cuMemImportFromShareableHandle);
    if (!shim.memory_limited)
        return shim_real.cuMemImportFromShareableHandle(handle, osHandle, shHandleType);
    shim_gate_enter();
    CUresult rc = shim_real.cuMemImportFromShareableHandle(handle, osHandle, shHandleType);
    if (rc == CUDA_SUCCESS) {
        uint64_t id = __atomic_fetch_add(&next_vmm_id, 1, __ATOMIC_RELAXED);
        struct shim_entry h = {.key = *handle, .peer = id, .kind = SHIM_KIND_HANDLE, .gpu = -1};
        struct shim_entry a = {.key = id, .kind = SHIM_KIND_VMM, .gpu = -1, .device = -1,
                               .refs = 1};
        if (shim_table_put(&a) != 0 || shim_table_put(&h) != 0)
            SHIM_ERROR("out of memory recording an imported allocation");
    }
    shim_gate_leave();
    return rc;
}

/* A VMM allocation loses a reference (its handle released, or a mapping unmapped). */
static void vmm_unref(uint64_t id)
{
    struct shim_entry a;
    if (shim_table_add_refs(SHIM_KIND_VMM, id, -1, &a) && a.refs == 0)
        shim_uncharge(&a);
}

SHIM_EXPORT CUresult cuMemRelease(CUmemGenericAllocationHandle handle)
{
    REAL_OR_NOT_FOUND(cuMemRelease);
    if (!shim.memory_limited)
        return shim_real.cuMemRelease(handle);
    struct shim_lock *key_lock = shim_key_lock(SHIM_KIND_HANDLE, handle);
    struct shim_entry h;
    bool tracked = shim_table_take(SHIM_KIND_HANDLE, handle, &h);
    bool closed = !tracked;
    if (closed) { /* maybe a handle being recorded: wait for it */
        shim_gate_close();
        tracked = shim_table_take(SHIM_KIND_HANDLE, handle, &h);
    }
    CUresult rc = shim_real.cuMemRelease(handle);
    if (tracked && rc != CUDA_SUCCESS) {
        shim_table_put(&h);
    } else if (tracked) {
        if (h.refs > 0) { /* a retained reference: the handle stays valid */
            h.refs--;
            shim_table_put(&h);
        }
        vmm_unref(h.peer);
    }
    if (closed)
        shim_gate_open();
    shim_key_unlock(key_lock);
    return rc;
}

struct mapping_at {
    uint64_t addr;
    bool found;
    uint64_t vmm;
};

/* A sweep that removes nothing: it finds the mapping an address falls in (any address inside
 * it, as cuMemRetainAllocationHandle accepts). */
static bool mapping_containing(const struct shim_entry *e, void *arg)
{
    struct mapping_at *at = arg;
    if (e->kind == SHIM_KIND_MAPPING && at->addr >= e->key && at->addr - e->key < e->bytes) {
        at->found = true;
        at->vmm = e->peer;
    }
    return false;
}

/* A retained handle is one more reference to its allocation - each retain needs a cuMemRelease
 * of its own - so, as the driver keeps the memory for it, the charge stays until the last
 * release and the last unmapping. The handle's record counts the retains; a handle released
 * while still mapped and retained again is recorded anew, naming the allocation of the mapping
 * the address is in. Recorded under the handle's key lock, after the driver's answer (the
 * handle is not known before it); cuMemRelease of the same handle waits on that lock. If the
 * shim knows neither the handle nor a mapping at the address by then - another thread unmapped
 * it after the driver answered, and the charge may be gone - the reference is given back and the
 * retain answers as if that unmapping had come first (CUDA_ERROR_INVALID_VALUE), so memory is
 * never held uncharged. */
SHIM_EXPORT CUresult cuMemRetainAllocationHandle(CUmemGenericAllocationHandle *handle, void *addr)
{
    REAL_OR_NOT_FOUND(cuMemRetainAllocationHandle);
    CUresult rc = shim_real.cuMemRetainAllocationHandle(handle, addr);
    if (!shim.memory_limited || rc != CUDA_SUCCESS)
        return rc;
    struct shim_lock *key_lock = shim_key_lock(SHIM_KIND_HANDLE, *handle);
    struct shim_entry h;
    if (shim_table_get(SHIM_KIND_HANDLE, *handle, &h)) {
        h.refs++;
        if (shim_table_add_refs(SHIM_KIND_VMM, h.peer, +1, NULL))
            shim_table_put(&h);
    } else {
        struct mapping_at at = {.addr = key_of((CUdeviceptr)(uintptr_t)addr)};
        shim_table_sweep(mapping_containing, NULL, &at);
        if (at.found && shim_table_add_refs(SHIM_KIND_VMM, at.vmm, +1, NULL)) {
            struct shim_entry fresh = {.key = *handle, .peer = at.vmm, .kind = SHIM_KIND_HANDLE,
                                       .gpu = -1};
            shim_table_put(&fresh);
        } else {
            SHIM_DEBUG("cuMemRetainAllocationHandle: no mapping recorded at the address; refused");
            shim_real.cuMemRelease(*handle);
            rc = CUDA_ERROR_INVALID_VALUE;
        }
    }
    shim_key_unlock(key_lock);
    return rc;
}

SHIM_EXPORT CUresult cuMemMap(CUdeviceptr ptr, size_t size, size_t offset,
                              CUmemGenericAllocationHandle handle, unsigned long long flags)
{
    REAL_OR_NOT_FOUND(cuMemMap);
    if (!shim.memory_limited)
        return shim_real.cuMemMap(ptr, size, offset, handle, flags);
    shim_gate_enter();
    CUresult rc = shim_real.cuMemMap(ptr, size, offset, handle, flags);
    struct shim_entry h;
    if (rc == CUDA_SUCCESS && shim_table_get(SHIM_KIND_HANDLE, handle, &h) &&
        shim_table_add_refs(SHIM_KIND_VMM, h.peer, +1, NULL)) {
        struct shim_entry m = {.key = key_of(ptr), .bytes = size, .peer = h.peer,
                               .kind = SHIM_KIND_MAPPING, .gpu = -1};
        struct shim_entry stale;
        if (shim_table_take(SHIM_KIND_MAPPING, m.key, &stale))
            vmm_unref(stale.peer); /* the driver mapped the address again: the old one is gone */
        shim_table_put(&m);
    }
    shim_gate_leave();
    return rc;
}

/* Take out the mappings that [ptr, ptr + size) covers, at most `max`. */
static int take_mappings(CUdeviceptr ptr, size_t size, struct shim_entry *taken, int max)
{
    int n = 0;
    for (uint64_t at = key_of(ptr); at < key_of(ptr) + size && n < max;) {
        if (!shim_table_take(SHIM_KIND_MAPPING, at, &taken[n]))
            break;
        at += taken[n].bytes > 0 ? taken[n].bytes : 1;
        n++;
    }
    return n;
}

SHIM_EXPORT CUresult cuMemUnmap(CUdeviceptr ptr, size_t size)
{
    REAL_OR_NOT_FOUND(cuMemUnmap);
    if (!shim.memory_limited)
        return shim_real.cuMemUnmap(ptr, size);
    /* The range covers whole mappings (CUDA requires it): take them out first, so a mapping
     * another thread makes at a freed address right after is not mistaken for one of them. */
    enum { MAX_TAKEN = 64 };
    struct shim_entry taken[MAX_TAKEN];
    struct shim_lock *key_lock = shim_key_lock(SHIM_KIND_MAPPING, key_of(ptr));
    int n = take_mappings(ptr, size, taken, MAX_TAKEN);
    bool closed = n == 0;
    if (closed) { /* maybe a mapping being recorded: wait for it */
        shim_gate_close();
        n = take_mappings(ptr, size, taken, MAX_TAKEN);
    }
    CUresult rc = shim_real.cuMemUnmap(ptr, size);
    if (closed)
        shim_gate_open();
    shim_key_unlock(key_lock);
    for (int i = 0; i < n; i++) {
        if (rc != CUDA_SUCCESS) {
            shim_table_put(&taken[i]);
            continue;
        }
        vmm_unref(taken[i].peer);
    }
    return rc;
}

static uint64_t format_bytes(CUarray_format f)
{
    switch (f) {
    case CU_AD_FORMAT_UNSIGNED_INT8:
    case CU_AD_FORMAT_SIGNED_INT8:
        return 1;
    case CU_AD_FORMAT_UNSIGNED_INT16:
    case CU_AD_FORMAT_SIGNED_INT16:
    case CU_AD_FORMAT_HALF:
        return 2;
    default:
        return 4; /* 32-bit formats; the largest of the basic ones */
    }
}

static uint64_t array_bytes(size_t w, size_t h, size_t d, CUarray_format f, unsigned channels)
{
    uint64_t n = (uint64_t)w * (h ? h : 1) * (d ? d : 1);
    return n * format_bytes(f) * (channels ? channels : 1);
}

/* One of the two array creations: desc2 (cuArrayCreate_v2) or desc3 (cuArray3DCreate_v2). */
struct array_call {
    CUarray *array;
    const CUDA_ARRAY_DESCRIPTOR *desc2;
    const CUDA_ARRAY3D_DESCRIPTOR *desc3;
};

static __attribute__((cold)) CUresult call_array(void *p)
{
    struct array_call *a = p;
    return a->desc2 != NULL ? shim_real.cuArrayCreate_v2(a->array, a->desc2)
                            : shim_real.cuArray3DCreate_v2(a->array, a->desc3);
}

SHIM_EXPORT CUresult cuArrayCreate_v2(CUarray *array, const CUDA_ARRAY_DESCRIPTOR *desc)
{
    REAL_OR_NOT_FOUND(cuArrayCreate_v2);
    if (desc == NULL)
        return shim_real.cuArrayCreate_v2(array, desc);
    struct shim_charge c;
    CUresult rc = shim_charge_begin(
        &c, -1, array_bytes(desc->Width, desc->Height, 1, desc->Format, desc->NumChannels));
    if (rc != CUDA_SUCCESS)
        return rc;
    rc = shim_real.cuArrayCreate_v2(array, desc);
    if (SHIM_UNLIKELY(rc == CUDA_ERROR_OUT_OF_MEMORY)) {
        struct array_call a = {array, desc, NULL};
        rc = shim_charge_retry(&c, call_array, &a);
    }
    if (rc == CUDA_SUCCESS)
        shim_charge_commit(&c, SHIM_KIND_ARRAY, (uint64_t)(uintptr_t)*array);
    else
        shim_charge_abort(&c);
    return rc;
}

SHIM_EXPORT CUresult cuArray3DCreate_v2(CUarray *array, const CUDA_ARRAY3D_DESCRIPTOR *desc)
{
    REAL_OR_NOT_FOUND(cuArray3DCreate_v2);
    if (desc == NULL)
        return shim_real.cuArray3DCreate_v2(array, desc);
    struct shim_charge c;
    CUresult rc = shim_charge_begin(&c, -1,
                                    array_bytes(desc->Width, desc->Height, desc->Depth,
                                                desc->Format, desc->NumChannels));
    if (rc != CUDA_SUCCESS)
        return rc;
    rc = shim_real.cuArray3DCreate_v2(array, desc);
    if (SHIM_UNLIKELY(rc == CUDA_ERROR_OUT_OF_MEMORY)) {
        struct array_call a = {array, NULL, desc};
        rc = shim_charge_retry(&c, call_array, &a);
    }
    if (rc == CUDA_SUCCESS)
        shim_charge_commit(&c, SHIM_KIND_ARRAY, (uint64_t)(uintptr_t)*array);
    else
        shim_charge_abort(&c);
    return rc;
}

/* ------------------------------------------------------------------ frees --------------- */

/* Settle a free of entry `e` by the driver's answer `rc`: give the bytes back if it freed, else
 * put the entry back. `into_pool`: a stream-ordered free, whose memory stays in its pool's cache
 * (pools.h). */
static void settle_free(const struct shim_entry *e, CUresult rc, bool into_pool)
{
    if (rc != CUDA_SUCCESS)
        shim_table_put(e);
    else if ((into_pool || e->pool != 0) && e->gpu >= 0)
        shim_pools_freed(e->device, e->bytes, e->pool);
    else
        shim_uncharge(e);
}

/* The driver's free of `key` (a stream, or NULL, in `stream`): what free_tracked calls. The key
 * is the freed object itself, so no argument block is built on the stack. */
typedef CUresult (*free_call)(uint64_t key, CUstream stream);

/* A free of a key the table does not hold (a stale or double free, or an allocation in flight
 * on another thread): looked up again once allocations in flight are recorded, and freed while
 * none can be. Out of line: a free that finds its key keeps this frame off its stack. */
static __attribute__((noinline)) CUresult free_untracked(enum shim_kind kind, uint64_t key,
                                                         free_call call, CUstream stream,
                                                         bool into_pool)
{
    struct shim_entry e;
    shim_gate_close();
    bool tracked = shim_table_take(kind, key, &e);
    CUresult rc = call(key, stream);
    if (tracked)
        settle_free(&e, rc, into_pool);
    else if (rc == CUDA_SUCCESS)
        SHIM_DEBUG("the driver freed %#llx, which the shim had not recorded",
                   (unsigned long long)key);
    shim_gate_open();
    return rc;
}

/* Take the entry out, call the real free, settle by its answer (keylock.h orders it with the
 * other calls on the key). A key the table does not hold goes to free_untracked. Inlined into
 * each free hook, so that the free of a recorded pointer is one frame, not three, on the stack
 * (whose lines the driver's work evicts too). */
static inline __attribute__((always_inline)) CUresult
free_tracked(enum shim_kind kind, uint64_t key, free_call call, CUstream stream, bool into_pool)
{
    if (!shim.memory_limited)
        return call(key, stream);
    struct shim_entry e;
    CUresult rc;
    struct shim_lock *key_lock = shim_key_lock(kind, key);
    if (SHIM_LIKELY(shim_table_take(kind, key, &e))) {
        rc = call(key, stream);
        settle_free(&e, rc, into_pool);
    } else {
        rc = free_untracked(kind, key, call, stream, into_pool);
    }
    shim_key_unlock(key_lock);
    return rc;
}

static CUresult call_free(uint64_t key, CUstream stream)
{
    (void)stream;
    return shim.calls.cuMemFree_v2((CUdeviceptr)key);
}

static CUresult call_free_async(uint64_t key, CUstream stream)
{
    return shim_real.cuMemFreeAsync((CUdeviceptr)key, stream);
}

static CUresult call_free_async_ptsz(uint64_t key, CUstream stream)
{
    return shim_real.cuMemFreeAsync_ptsz((CUdeviceptr)key, stream);
}

static CUresult call_array_destroy(uint64_t key, CUstream stream)
{
    (void)stream;
    return shim_real.cuArrayDestroy((CUarray)(uintptr_t)key);
}

SHIM_EXPORT CUresult cuMemFree_v2(CUdeviceptr dptr)
{
    shim_init();
    return free_tracked(SHIM_KIND_DEVICE, key_of(dptr), call_free, NULL, false);
}

SHIM_EXPORT CUresult cuMemFreeAsync(CUdeviceptr dptr, CUstream stream)
{
    REAL_OR_NOT_FOUND(cuMemFreeAsync);
    return free_tracked(SHIM_KIND_DEVICE, key_of(dptr), call_free_async, stream, true);
}

SHIM_EXPORT CUresult cuMemFreeAsync_ptsz(CUdeviceptr dptr, CUstream stream)
{
    REAL_OR_NOT_FOUND(cuMemFreeAsync_ptsz);
    return free_tracked(SHIM_KIND_DEVICE, key_of(dptr), call_free_async_ptsz, stream, true);
}

SHIM_EXPORT CUresult cuArrayDestroy(CUarray array)
{
    REAL_OR_NOT_FOUND(cuArrayDestroy);
    return free_tracked(SHIM_KIND_ARRAY, (uint64_t)(uintptr_t)array, call_array_destroy, NULL,
                        false);
}

/* Destroying a context frees what was allocated in it. */
SHIM_EXPORT CUresult cuCtxDestroy_v2(CUcontext ctx)
{
    shim_init();
    CUresult rc = shim_real.cuCtxDestroy_v2(ctx);
    if (rc == CUDA_SUCCESS) {
        shim_uncharge_context(ctx);
        shim_forget_context(ctx);
    }
    return rc;
}

SHIM_EXPORT CUresult cuDevicePrimaryCtxRetain(CUcontext *pctx, CUdevice dev)
{
    shim_init();
    CUresult rc = shim_real.cuDevicePrimaryCtxRetain(pctx, dev);
    if (rc == CUDA_SUCCESS && dev >= 0 && dev < SHIM_MAX_DEVICES)
        __atomic_store_n(&shim.devices[dev].primary, *pctx, __ATOMIC_RELEASE);
    return rc;
}

/* After the last release (or a reset) of a primary context its allocations are gone. */
static void primary_gone_if_inactive(CUdevice dev, bool reset)
{
    if (dev < 0 || dev >= SHIM_MAX_DEVICES)
        return;
    CUcontext primary = __atomic_load_n(&shim.devices[dev].primary, __ATOMIC_ACQUIRE);
    if (primary == NULL)
        return;
    unsigned int flags = 0;
    int active = 1;
    if (!reset && shim_real.cuDevicePrimaryCtxGetState(dev, &flags, &active) != CUDA_SUCCESS)
        return;
    if (reset || !active)
        shim_uncharge_context(primary);
}

SHIM_EXPORT CUresult cuDevicePrimaryCtxRelease(CUdevice dev)
{
    REAL_OR_NOT_FOUND(cuDevicePrimaryCtxRelease);
    CUresult rc = shim_real.cuDevicePrimaryCtxRelease(dev);
    if (rc == CUDA_SUCCESS)
        primary_gone_if_inactive(dev, false);
    return rc;
}

SHIM_EXPORT CUresult cuDevicePrimaryCtxRelease_v2(CUdevice dev)
{
    REAL_OR_NOT_FOUND(cuDevicePrimaryCtxRelease_v2);
    CUresult rc = shim_real.cuDevicePrimaryCtxRelease_v2(dev);
    if (rc == CUDA_SUCCESS)
        primary_gone_if_inactive(dev, false);
    return rc;
}

SHIM_EXPORT CUresult cuDevicePrimaryCtxReset(CUdevice dev)
{
    REAL_OR_NOT_FOUND(cuDevicePrimaryCtxReset);
    CUresult rc = shim_real.cuDevicePrimaryCtxReset(dev);
    if (rc == CUDA_SUCCESS)
        primary_gone_if_inactive(dev, true);
    return rc;
}

SHIM_EXPORT CUresult cuDevicePrimaryCtxReset_v2(CUdevice dev)
{
    REAL_OR_NOT_FOUND(cuDevicePrimaryCtxReset_v2);
    CUresult rc = shim_real.cuDevicePrimaryCtxReset_v2(dev);
    if (rc == CUDA_SUCCESS)
        primary_gone_if_inactive(dev, true);
    return rc;
}

/* ------------------------------------------------------------------ reporting ----------- */

/* Reporting sweeps for dead processes more often than allocating does: what it shows must be
 * current within a second of a death. */
#define INFO_REAP_INTERVAL_NS 100000000ULL

SHIM_EXPORT CUresult cuMemGetInfo_v2(size_t *free_bytes, size_t *total_bytes)
{
    shim_init();
    CUresult rc = shim_real.cuMemGetInfo_v2(free_bytes, total_bytes);
    if (rc != CUDA_SUCCESS || !shim.memory_limited || !shim_devices_ready())
        return rc;
    int dev = -1;
    if (!shim_current_device(&dev, NULL))
        return rc;
    const struct shim_device *d = shim_device(dev);
    if (d == NULL || d->memory_limit == TESSERA_NO_MEMORY_LIMIT)
        return rc;
    tessera_region_maybe_reap(&shim.region, INFO_REAP_INTERVAL_NS);
    shim_pools_settle(dev);
    uint64_t total = d->memory_limit < *total_bytes ? d->memory_limit : *total_bytes;
    uint64_t used = tessera_region_used(shim.region.map, d->gpu);
    uint64_t free = used < total ? total - used : 0;
    if (free > *free_bytes)
        free = *free_bytes; /* the GPU itself has less left than the claim may still take */
    *total_bytes = (size_t)total;
    *free_bytes = (size_t)free;
    return rc;
}

SHIM_EXPORT CUresult cuDeviceTotalMem_v2(size_t *bytes, CUdevice dev)
{
    shim_init();
    CUresult rc = shim_real.cuDeviceTotalMem_v2(bytes, dev);
    if (rc != CUDA_SUCCESS || !shim.memory_limited || !shim_devices_ready())
        return rc;
    const struct shim_device *d = shim_device(dev);
    if (d != NULL && d->memory_limit < *bytes)
        *bytes = (size_t)d->memory_limit;
    return rc;
}

/* ------------------------------------------------------------------ not accounted ------ */

/* Mipmapped arrays (padded per level by the driver) are not accounted yet; rather than let them
 * bypass the limit they are refused (CUDA_ERROR_NOT_SUPPORTED) while a memory limit is in force,
 * and pass through otherwise. (Graph memory nodes are charged when their graph is instantiated:
 * cuda_graph_hooks.c.) */
#define UNACCOUNTED_GUARD(name)                                                                   \
    do {                                                                                          \
        shim_init();                                                                              \
        if (shim.memory_limited) {                                                                \
            SHIM_DEBUG("%s refused: not accounted while a memory limit is in force", #name);      \
            return CUDA_ERROR_NOT_SUPPORTED;                                                      \
        }                                                                                         \
        if (shim_real.name == NULL)                                                               \
            return CUDA_ERROR_NOT_FOUND;                                                          \
    } while (0)

SHIM_EXPORT CUresult cuMipmappedArrayCreate(CUmipmappedArray *array,
                                            const CUDA_ARRAY3D_DESCRIPTOR *desc,
                                            unsigned int levels)
{
    UNACCOUNTED_GUARD(cuMipmappedArrayCreate);
    return shim_real.cuMipmappedArrayCreate(array, desc, levels);
}

/* ------------------------------------------------------------------ CUDA 2.x ABI -------- */

/* The 32-bit entry points predate everything the shim accounts for and no current program uses
 * them; rather than let them bypass the limit they are refused while a memory limit is in force,
 * and pass through otherwise. */
#define LEGACY_GUARD(name)                                                                        \
    do {                                                                                          \
        shim_init();                                                                              \
        if (shim.memory_limited)                                                                  \
            return CUDA_ERROR_NOT_SUPPORTED;                                                      \
        if (shim_real.name == NULL)                                                               \
            return CUDA_ERROR_NOT_FOUND;                                                          \
    } while (0)

SHIM_EXPORT CUresult cuMemAlloc(unsigned int *dptr, unsigned int bytesize)
{
    LEGACY_GUARD(cuMemAlloc);
    return shim_real.cuMemAlloc(dptr, bytesize);
}

SHIM_EXPORT CUresult cuMemAllocPitch(unsigned int *dptr, unsigned int *pitch,
                                     unsigned int widthInBytes, unsigned int height,
                                     unsigned int elementSizeBytes)
{
    LEGACY_GUARD(cuMemAllocPitch);
    return shim_real.cuMemAllocPitch(dptr, pitch, widthInBytes, height, elementSizeBytes);
}

SHIM_EXPORT CUresult cuArrayCreate(CUarray *array, const void *desc)
{
    LEGACY_GUARD(cuArrayCreate);
    return shim_real.cuArrayCreate(array, desc);
}

SHIM_EXPORT CUresult cuArray3DCreate(CUarray *array, const void *desc)
{
    LEGACY_GUARD(cuArray3DCreate);
    return shim_real.cuArray3DCreate(array, desc);
}

SHIM_EXPORT CUresult cuMemGetInfo(unsigned int *free_bytes, unsigned int *total_bytes)
{
    LEGACY_GUARD(cuMemGetInfo);
    return shim_real.cuMemGetInfo(free_bytes, total_bytes);
}

SHIM_EXPORT CUresult cuDeviceTotalMem(unsigned int *bytes, CUdevice dev)
{
    LEGACY_GUARD(cuDeviceTotalMem);
    return shim_real.cuDeviceTotalMem(bytes, dev);
}
