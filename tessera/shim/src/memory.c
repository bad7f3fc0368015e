/* Device-memory accounting (memory.h). */
#include "memory.h"

#include <errno.h>
#include <time.h>

#include "graph_mem.h"
#include "keylock.h"
#include "log.h"
#include "pools.h"

/* How often (at most) an allocating process sweeps the region for dead processes' memory. */
#define REAP_INTERVAL_NS 500000000ULL

/* `bytes` did not fit on region GPU `gpu` (CUDA ordinal `dev`): the process's pool caches, then
 * its graph memory cache, give back what they hold (pools.h, graph_mem.h), and it is tried again
 * after each. */
static bool reserve_after_reclaim(int dev, int gpu, uint64_t bytes, uint64_t limit)
{
    if (shim_pools_reclaim(dev) && tessera_region_reserve(&shim.region, gpu, bytes, limit) == 0)
        return true;
    return shim_graph_reclaim(dev) && tessera_region_reserve(&shim.region, gpu, bytes, limit) == 0;
}

CUresult shim_charge_begin(struct shim_charge *c, int dev, uint64_t bytes)
{
    /* No field gets a constant the compiler would load from memory (its line would be one more
     * cold miss per allocation): the limit is set with gpu, the device as asked until known. */
    c->gpu = -1;
    c->device = dev;
    c->bytes = 0;
    c->limit = 0;
    c->ctx = NULL;
    c->pool = 0;
    c->gated = false;
    shim_init();
    if (SHIM_LIKELY(!shim.memory_limited))
        return CUDA_SUCCESS;
    int current = -1;
    bool have_ctx = shim_devices_ready() && shim_current_device(&current, &c->ctx);
    if (dev < 0)
        dev = current; /* no context: the real call fails on its own */
    const struct shim_device *d = have_ctx || dev >= 0 ? shim_device(dev) : NULL;
    if (d == NULL || d->memory_limit == TESSERA_NO_MEMORY_LIMIT) {
        c->device = dev;
        shim_gate_enter();
        c->gated = true;
        return CUDA_SUCCESS;
    }
    if (!shim_slot())
        return CUDA_ERROR_OUT_OF_MEMORY;
    tessera_region_maybe_reap(&shim.region, REAP_INTERVAL_NS);
    if (tessera_region_reserve(&shim.region, d->gpu, bytes, d->memory_limit) != 0 &&
        !reserve_after_reclaim(dev, d->gpu, bytes, d->memory_limit)) {
        SHIM_DEBUG("refused %llu bytes on CUDA device %d: the claim holds %llu of %llu",
                   (unsigned long long)bytes, dev,
                   (unsigned long long)tessera_region_used(shim.region.map, d->gpu),
                   (unsigned long long)d->memory_limit);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    c->gpu = d->gpu;
    c->device = dev;
    c->bytes = bytes;
    c->limit = d->memory_limit;
    shim_gate_enter();
    c->gated = true;
    return CUDA_SUCCESS;
}

/* Pauses between tries: half the time waited so far, from 1 ms up to 50 ms, so that a short
 * squeeze costs little delay and a long one few calls. */
#define RETRY_PAUSE_MIN_NS 1000000ULL
#define RETRY_PAUSE_MAX_NS 50000000ULL

__attribute__((noinline, cold)) CUresult shim_charge_retry(struct shim_charge *c,
                                                          CUresult (*call)(void *), void *arg)
{
    if (c->gpu < 0)
        return CUDA_ERROR_OUT_OF_MEMORY;
    SHIM_WARN("CUDA device %d has no memory free for %llu bytes that the claim has room for "
              "(it holds %llu of %llu): memory taken around the shim; trying again for up to "
              "%llu ms",
              c->device, (unsigned long long)c->bytes,
              (unsigned long long)tessera_region_used(shim.region.map, c->gpu),
              (unsigned long long)c->limit, TESSERA_OOM_WAIT_NS / 1000000ULL);
    uint64_t refused_at = tessera_now_ns();
    for (;;) {
        uint64_t waited = tessera_now_ns() - refused_at;
        if (waited >= TESSERA_OOM_WAIT_NS)
            break;
        uint64_t pause = waited / 2;
        pause = pause < RETRY_PAUSE_MIN_NS   ? RETRY_PAUSE_MIN_NS
                : pause > RETRY_PAUSE_MAX_NS ? RETRY_PAUSE_MAX_NS
                                             : pause;
        if (pause > TESSERA_OOM_WAIT_NS - waited)
            pause = TESSERA_OOM_WAIT_NS - waited;
        /* Out of the allocation gate while asleep: a free of an unknown pointer closes it, and
         * every other allocation of the process would wait behind that free for this one.
         * Nothing the driver handed out is unrecorded meanwhile. */
        if (c->gated)
            shim_gate_leave();
        struct timespec ts = {(time_t)(pause / 1000000000ULL), (long)(pause % 1000000000ULL)};
        while (nanosleep(&ts, &ts) != 0 && errno == EINTR)
            ;
        if (c->gated)
            shim_gate_enter();
        CUresult rc = call(arg);
        if (rc != CUDA_ERROR_OUT_OF_MEMORY)
            return rc;
    }
    SHIM_WARN("CUDA device %d still has no memory free for %llu bytes after %llu ms: "
              "CUDA_ERROR_OUT_OF_MEMORY",
              c->device, (unsigned long long)c->bytes, TESSERA_OOM_WAIT_NS / 1000000ULL);
    return CUDA_ERROR_OUT_OF_MEMORY;
}

static void leave_gate(struct shim_charge *c)
{
    if (c->gated)
        shim_gate_leave();
    c->gated = false;
}

bool shim_charge_resize(struct shim_charge *c, uint64_t bytes)
{
    if (c->gpu < 0 || bytes == c->bytes)
        return true;
    if (bytes < c->bytes) {
        tessera_region_release(&shim.region, c->gpu, c->bytes - bytes);
    } else if (tessera_region_reserve(&shim.region, c->gpu, bytes - c->bytes, c->limit) != 0) {
        return false;
    }
    c->bytes = bytes;
    return true;
}

void shim_charge_hand_over(struct shim_charge *c, uint64_t bytes)
{
    if (c->gpu >= 0)
        c->bytes -= bytes; /* at most what was charged beyond the allocation */
}

/* Record `e` over the entry the table still holds for its key (shim_table_insert found one),
 * or report that there was no memory for it (`inserted` < 0). Out of line: the stale entry's
 * copy is not on the stack of every allocation. */
static __attribute__((noinline, cold)) void record_over(const struct shim_entry *e,
                                                        int inserted)
{
    struct shim_entry stale;
    int replaced = inserted < 0 ? -1 : shim_table_put_replacing(e, &stale);
    if (replaced < 0)
        SHIM_ERROR("out of memory recording an allocation; its %llu bytes stay charged",
                   (unsigned long long)e->bytes);
    if (replaced > 0) { /* a record the driver's own free outlived (a context swept late) */
        SHIM_DEBUG("the driver handed out %#llx again: its old record is given back",
                   (unsigned long long)e->key);
        shim_uncharge(&stale);
    }
}

void shim_charge_commit(struct shim_charge *c, enum shim_kind kind, uint64_t key)
{
    if (!c->gated)
        return;
    struct shim_entry e = {.key = key, .bytes = c->gpu >= 0 ? c->bytes : 0,
                           .peer = (uint64_t)(uintptr_t)c->ctx, .pool = c->pool, .gpu = c->gpu,
                           .device = c->device, .kind = (uint8_t)kind, .refs = 1};
    int inserted = shim_table_insert(&e);
    if (SHIM_UNLIKELY(inserted != 0))
        record_over(&e, inserted);
    leave_gate(c);
}

void shim_charge_abort(struct shim_charge *c)
{
    if (c->gpu >= 0)
        tessera_region_release(&shim.region, c->gpu, c->bytes);
    c->gpu = -1;
    leave_gate(c);
}

void shim_uncharge(const struct shim_entry *e)
{
    if (e->gpu >= 0)
        tessera_region_release(&shim.region, e->gpu, e->bytes);
}

static bool of_context(const struct shim_entry *e, void *arg)
{
    return (e->kind == SHIM_KIND_DEVICE || e->kind == SHIM_KIND_ARRAY) &&
           e->peer == (uint64_t)(uintptr_t)arg;
}

static void uncharge_removed(const struct shim_entry *e, void *arg)
{
    (void)arg;
    shim_uncharge(e);
    shim_pools_dropped(e->device, e->pool);
}

void shim_uncharge_context(CUcontext ctx)
{
    if (ctx == NULL || !shim.memory_limited)
        return;
    int n = shim_table_sweep(of_context, uncharge_removed, ctx);
    if (n > 0)
        SHIM_DEBUG("context %p destroyed with %d allocations; their memory is given back",
                   (void *)ctx, n);
}
