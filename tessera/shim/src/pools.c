/* Pool-cached memory (pools.h). */
#include "pools.h"

#include <pthread.h>
#include <string.h>

#include "log.h"

/* A tracked pool. A pool destroyed while allocations from it are outstanding keeps its place
 * (its handle no longer found) until the last of them is freed: the driver keeps its
 * reservation until then, and `kept` is what it holds beyond those allocations. */
struct pool_slot {
    CUmemoryPool pool;
    uint64_t id;   /* the pointer table's name for it (never reused, unlike handles) */
    uint64_t live; /* allocations from it in the pointer table */
    uint64_t kept; /* destroyed: its reservation beyond `live`'s allocations */
    bool destroyed;
};

struct pool_set {
    struct pool_slot pools[SHIM_MAX_POOLS];
    int n;
    uint64_t cached; /* charged for what the pools hold beyond their allocations */
};

static struct pool_set sets[SHIM_MAX_DEVICES];
static uint64_t next_id = 1;
static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;

static int find_locked(const struct pool_set *s, CUmemoryPool pool)
{
    for (int i = 0; i < s->n; i++)
        if (s->pools[i].pool == pool && !s->pools[i].destroyed)
            return i;
    return -1;
}

static int find_id_locked(const struct pool_set *s, uint64_t id)
{
    for (int i = 0; i < s->n; i++)
        if (s->pools[i].id == id)
            return i;
    return -1;
}

static void remove_locked(struct pool_set *s, int i)
{
    s->pools[i] = s->pools[--s->n];
}

/* RESERVED_MEM_CURRENT - USED_MEM_CURRENT of a live pool; false if it cannot be queried. */
static bool pool_free(CUmemoryPool pool, uint64_t *out)
{
    cuuint64_t reserved = 0, used = 0;
    if (shim_real.cuMemPoolGetAttribute(pool, CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT, &reserved) !=
            CUDA_SUCCESS ||
        shim_real.cuMemPoolGetAttribute(pool, CU_MEMPOOL_ATTR_USED_MEM_CURRENT, &used) !=
            CUDA_SUCCESS)
        return false;
    *out = reserved > used ? reserved - used : 0;
    return true;
}

int shim_pools_track(int dev, CUmemoryPool pool, bool created)
{
    if (dev < 0 || dev >= SHIM_MAX_DEVICES)
        return -1;
    struct pool_set *s = &sets[dev];
    int rc = 0;
    pthread_mutex_lock(&mu);
    if (find_locked(s, pool) < 0) {
        if (s->n < SHIM_MAX_POOLS - (created ? 1 : 0))
            s->pools[s->n++] = (struct pool_slot){.pool = pool, .id = next_id++};
        else
            rc = -1;
    }
    pthread_mutex_unlock(&mu);
    return rc;
}

int shim_pools_device(CUmemoryPool pool)
{
    int dev = -1;
    pthread_mutex_lock(&mu);
    for (int d = 0; d < SHIM_MAX_DEVICES && dev < 0; d++)
        if (find_locked(&sets[d], pool) >= 0)
            dev = d;
    pthread_mutex_unlock(&mu);
    return dev;
}

/* What the pools of `s` hold beyond their allocations, as the driver reports it now. (A pool
 * is tracked only once the driver has created or allocated from it, so the driver has the pool
 * API of CUDA 11.2 these calls belong to.) */
static uint64_t pools_cached_locked(const struct pool_set *s)
{
    uint64_t sum = 0;
    for (int i = 0; i < s->n; i++) {
        uint64_t free_b = 0;
        if (s->pools[i].destroyed)
            sum += s->pools[i].kept;
        else if (pool_free(s->pools[i].pool, &free_b))
            sum += free_b;
    }
    return sum;
}

/* Charge or refund the difference between the cache charge and what the pools hold. A growth
 * is charged even past the limit: the driver already holds that memory (an allocation was
 * refused before it could take the claim past its limit), and charging it is what keeps the
 * claim's other allocations from adding to it. */
static void settle_locked(int dev)
{
    const struct shim_device *d = shim_device(dev);
    if (d == NULL || d->memory_limit == TESSERA_NO_MEMORY_LIMIT)
        return;
    struct pool_set *s = &sets[dev];
    uint64_t now = pools_cached_locked(s);
    if (now < s->cached)
        tessera_region_release(&shim.region, d->gpu, s->cached - now);
    else if (now > s->cached)
        tessera_region_reserve(&shim.region, d->gpu, now - s->cached, UINT64_MAX);
    s->cached = now;
}

uint64_t shim_pools_charge_for(uint64_t bytes)
{
    if (bytes > UINT64_MAX - (SHIM_POOL_GRANULE - 1))
        return UINT64_MAX;
    return (bytes + SHIM_POOL_GRANULE - 1) / SHIM_POOL_GRANULE * SHIM_POOL_GRANULE;
}

uint64_t shim_pools_settle_growth(int dev, uint64_t spare)
{
    if (dev < 0 || dev >= SHIM_MAX_DEVICES)
        return 0;
    const struct shim_device *d = shim_device(dev);
    if (d == NULL || d->memory_limit == TESSERA_NO_MEMORY_LIMIT)
        return 0;
    struct pool_set *s = &sets[dev];
    pthread_mutex_lock(&mu);
    uint64_t now = pools_cached_locked(s), taken = 0;
    if (now > s->cached) {
        taken = now - s->cached < spare ? now - s->cached : spare;
        s->cached += taken; /* moved from the allocation's charge: the claim's total is unchanged */
    }
    settle_locked(dev);
    pthread_mutex_unlock(&mu);
    return taken;
}

uint64_t shim_pools_allocated(int dev, CUmemoryPool pool)
{
    if (dev < 0 || dev >= SHIM_MAX_DEVICES)
        return 0;
    uint64_t id = 0;
    pthread_mutex_lock(&mu);
    int i = find_locked(&sets[dev], pool);
    if (i >= 0) {
        sets[dev].pools[i].live++;
        id = sets[dev].pools[i].id;
    }
    pthread_mutex_unlock(&mu);
    return id;
}

uint64_t shim_pools_free_of(CUmemoryPool pool)
{
    uint64_t free_b = 0;
    if (shim_pools_device(pool) < 0 || !pool_free(pool, &free_b))
        return 0;
    return free_b;
}

void shim_pools_forget(CUmemoryPool pool, uint64_t free_before)
{
    pthread_mutex_lock(&mu);
    for (int d = 0; d < SHIM_MAX_DEVICES; d++) {
        struct pool_set *s = &sets[d];
        int i = find_locked(s, pool);
        if (i >= 0) {
            if (s->pools[i].live > 0) {
                s->pools[i].destroyed = true;
                s->pools[i].kept = free_before;
            } else {
                remove_locked(s, i);
            }
            settle_locked(d);
            break;
        }
    }
    pthread_mutex_unlock(&mu);
}

/* One allocation from pool `id` on `dev` is gone; `bytes`: what of it the destroyed pool keeps
 * reserved (the reservation is released with its last allocation). */
static void gone_locked(int dev, uint64_t id, uint64_t bytes)
{
    struct pool_set *s = &sets[dev];
    int i = id != 0 ? find_id_locked(s, id) : -1;
    if (i < 0 || s->pools[i].live == 0)
        return;
    s->pools[i].live--;
    if (s->pools[i].destroyed) {
        s->pools[i].kept += bytes;
        if (s->pools[i].live == 0)
            remove_locked(s, i);
    }
}

void shim_pools_freed(int dev, uint64_t bytes, uint64_t id)
{
    if (dev < 0 || dev >= SHIM_MAX_DEVICES)
        return;
    pthread_mutex_lock(&mu);
    gone_locked(dev, id, bytes);
    sets[dev].cached += bytes;
    settle_locked(dev);
    pthread_mutex_unlock(&mu);
}

void shim_pools_dropped(int dev, uint64_t id)
{
    if (dev < 0 || dev >= SHIM_MAX_DEVICES || id == 0)
        return;
    pthread_mutex_lock(&mu);
    gone_locked(dev, id, 0);
    settle_locked(dev);
    pthread_mutex_unlock(&mu);
}

void shim_pools_settle(int dev)
{
    if (dev < 0 || dev >= SHIM_MAX_DEVICES)
        return;
    /* No pool and nothing charged for one: nothing to settle (the common case, asked by every
     * cuMemGetInfo). A pool being tracked meanwhile is settled by its own allocation. */
    if (__atomic_load_n(&sets[dev].n, __ATOMIC_RELAXED) == 0 &&
        __atomic_load_n(&sets[dev].cached, __ATOMIC_RELAXED) == 0)
        return;
    pthread_mutex_lock(&mu);
    settle_locked(dev);
    pthread_mutex_unlock(&mu);
}

bool shim_pools_reclaim(int dev)
{
    if (dev < 0 || dev >= SHIM_MAX_DEVICES)
        return false;
    struct pool_set *s = &sets[dev];
    pthread_mutex_lock(&mu);
    uint64_t before = s->cached;
    settle_locked(dev);
    if (s->cached > 0) {
        for (int i = 0; i < s->n; i++)
            if (!s->pools[i].destroyed)
                shim_real.cuMemPoolTrimTo(s->pools[i].pool, 0);
        settle_locked(dev);
    }
    bool less = s->cached < before;
    pthread_mutex_unlock(&mu);
    if (less)
        SHIM_DEBUG("memory pools on CUDA device %d trimmed: the claim is at its limit", dev);
    return less;
}

void shim_pools_child_after_fork(void)
{
    pthread_mutex_t fresh = PTHREAD_MUTEX_INITIALIZER;
    mu = fresh;
    memset(sets, 0, sizeof sets);
    next_id = 1;
}
