/* Pool-cached memory (pools.h). */
#include "pools.h"

#include <pthread.h>
#include <string.h>

#include "log.h"

struct pool_set {
    CUmemoryPool pools[SHIM_MAX_POOLS];
    int n;
    uint64_t cached; /* charged for what the pools hold beyond their allocations */
};

static struct pool_set sets[SHIM_MAX_DEVICES];
static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;

static int find_locked(const struct pool_set *s, CUmemoryPool pool)
{
    for (int i = 0; i < s->n; i++)
        if (s->pools[i] == pool)
            return i;
    return -1;
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
            s->pools[s->n++] = pool;
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
        cuuint64_t reserved = 0, used = 0;
        if (shim_real.cuMemPoolGetAttribute(s->pools[i], CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT,
                                            &reserved) != CUDA_SUCCESS ||
            shim_real.cuMemPoolGetAttribute(s->pools[i], CU_MEMPOOL_ATTR_USED_MEM_CURRENT,
                                            &used) != CUDA_SUCCESS)
            continue;
        if (reserved > used)
            sum += reserved - used;
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

/* Called for a stream-ordered allocation the driver has the entry point for, so it has the
 * pool API of CUDA 11.2 too. A pool that cannot be queried is taken to have nothing free. */
uint64_t shim_pools_charge_for(CUmemoryPool pool, uint64_t bytes)
{
    cuuint64_t reserved = 0, used = 0;
    if (shim_real.cuMemPoolGetAttribute(pool, CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT, &reserved) ==
            CUDA_SUCCESS &&
        shim_real.cuMemPoolGetAttribute(pool, CU_MEMPOOL_ATTR_USED_MEM_CURRENT, &used) ==
            CUDA_SUCCESS &&
        reserved >= used && reserved - used >= bytes)
        return bytes;
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

void shim_pools_forget(CUmemoryPool pool)
{
    pthread_mutex_lock(&mu);
    for (int d = 0; d < SHIM_MAX_DEVICES; d++) {
        struct pool_set *s = &sets[d];
        int i = find_locked(s, pool);
        if (i >= 0) {
            s->pools[i] = s->pools[--s->n];
            settle_locked(d);
            break;
        }
    }
    pthread_mutex_unlock(&mu);
}

void shim_pools_freed(int dev, uint64_t bytes)
{
    if (dev < 0 || dev >= SHIM_MAX_DEVICES)
        return;
    pthread_mutex_lock(&mu);
    sets[dev].cached += bytes;
    settle_locked(dev);
    pthread_mutex_unlock(&mu);
}

void shim_pools_settle(int dev)
{
    if (dev < 0 || dev >= SHIM_MAX_DEVICES)
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
            shim_real.cuMemPoolTrimTo(s->pools[i], 0);
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
}
