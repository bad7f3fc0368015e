/*
 * Memory that stream-ordered pools keep cached. cuMemFreeAsync does not give memory back to the
 * device: the pool keeps it reserved for reuse until a synchronisation trims the pool to its
 * release threshold, or cuMemPoolTrimTo does. The claim is charged what its pools reserve: an
 * allocation is charged before it is made for what it can make its pool grow by
 * (shim_pools_charge_for), the growth moves to the cache charge when settled
 * (shim_pools_settle_growth), its own charge becomes part of its device's cache charge when it
 * is freed, and the cache charge is settled to what the process's
 * pools on that device really hold beyond their allocations (the sum of
 * CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT - CU_MEMPOOL_ATTR_USED_MEM_CURRENT) whenever the shim
 * looks: at stream-ordered frees and allocations, cuMemPoolTrimTo, pool destruction,
 * cuMemGetInfo, and before an allocation is refused.
 */
#ifndef TESSERA_POOLS_H
#define TESSERA_POOLS_H

#include <stdint.h>

#include "shim_state.h"

/* Pools per device a process can have tracked (one place stays for the device's default pool,
 * which is tracked when first allocated from). */
#define SHIM_MAX_POOLS 64

/* Remember that `pool` lives on CUDA ordinal `dev`. `created`: the program created it (the
 * last place is kept for the default pool). Returns 0, or -1 if no place is left. */
int shim_pools_track(int dev, CUmemoryPool pool, bool created);

/* The CUDA ordinal of a tracked pool, or -1. */
int shim_pools_device(CUmemoryPool pool);

/* An allocation from tracked `pool` on `dev` succeeded. Returns the pool's id for the pointer
 * table (shim_entry.pool), 0 if the pool is not tracked. */
uint64_t shim_pools_allocated(int dev, CUmemoryPool pool);

/* What tracked `pool` holds beyond its allocations (0 if untracked or not queryable): read
 * before cuMemPoolDestroy, while the pool can still be queried. */
uint64_t shim_pools_free_of(CUmemoryPool pool);

/* `pool` was destroyed. Without outstanding allocations it is forgotten (the driver released
 * it); with some, the driver keeps its reservation until the last is freed, so it stays
 * counted: `free_before` (shim_pools_free_of) beside them, and each of them once freed, until
 * the last is freed, which refunds it all. Settles either way. */
void shim_pools_forget(CUmemoryPool pool, uint64_t free_before);

/* An allocation charged `bytes` on device `dev` from pool `id` (0: none known) was freed into
 * its pool: its charge now covers the pool's cache, until a settlement finds the pool released
 * it. */
void shim_pools_freed(int dev, uint64_t bytes, uint64_t id);

/* An allocation from pool `id` on `dev` is gone without being freed into the pool (its
 * context was destroyed; its charge was given back): count it out of the pool, and settle. */
void shim_pools_dropped(int dev, uint64_t id);

/* Settle device `dev`'s cache charge to what its pools hold beyond their allocations. */
void shim_pools_settle(int dev);

/* What a pool's reservation is taken to grow by when an allocation does not fit in it: the
 * allocation's size rounded up to this. Real drivers grow pools in granules of 2 MiB; the
 * granularity cannot be queried, so growth beyond this (a driver with a larger granule) is
 * charged only when settled. */
#define SHIM_POOL_GRANULE (2ull << 20)

/* What to charge before a stream-ordered allocation of `bytes`: `bytes` rounded up to
 * SHIM_POOL_GRANULE, what its pool grows by if it does not fit. The driver reports only a
 * pool's free reserved memory in total (RESERVED_MEM_CURRENT - USED_MEM_CURRENT), not whether
 * one piece of it holds the allocation, so no allocation is known to fit without growth; what
 * the pool did not grow by is refunded when settled (shim_pools_settle_growth). UINT64_MAX if
 * that does not fit in 64 bits. */
uint64_t shim_pools_charge_for(uint64_t bytes);

/* An allocation from a pool on device `dev` succeeded, charged `spare` bytes beyond its size for
 * the pool's growth: settle as shim_pools_settle, the cache's growth taken from `spare` first
 * (only the rest is charged anew). Returns how much of `spare` the cache took over. */
uint64_t shim_pools_settle_growth(int dev, uint64_t spare);

/* The claim is at its limit: give back what the process's pools on `dev` cache
 * (cuMemPoolTrimTo(pool, 0) on each) and settle. True if the cache charge went down. */
bool shim_pools_reclaim(int dev);

/* fork(): the child tracks nothing (its parent's pools are not its own). */
void shim_pools_child_after_fork(void);

#endif
