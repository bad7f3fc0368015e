/*
 * The process's table of what it holds: device pointers, arrays, VMM handles and mappings,
 * and contexts, each with the bytes it was charged and the GPU it was charged to. A
 * sharded open-addressing hash table: insert, lookup and removal are O(1) expected, whatever
 * the number of live entries, and threads contend only when they hit the same shard. Probing
 * reads a compact index, not the entries, so that at thousands of live entries what an
 * allocation and its free touch stays in the CPU's cache.
 */
#ifndef TESSERA_PTRTABLE_H
#define TESSERA_PTRTABLE_H

#include <stdbool.h>
#include <stdint.h>

#include "lock.h"

enum shim_kind {
    SHIM_KIND_DEVICE = 1, /* cuMemAlloc family, pitch, managed, async/pool: key = CUdeviceptr */
    SHIM_KIND_ARRAY = 2,  /* cuArrayCreate/cuArray3DCreate: key = CUarray */
    SHIM_KIND_HANDLE = 3, /* cuMemCreate: key = CUmemGenericAllocationHandle; peer = VMM id */
    SHIM_KIND_MAPPING = 4, /* cuMemMap: key = virtual address; peer = VMM id; bytes = length */
    SHIM_KIND_CONTEXT = 6, /* context -> device ordinal cache */
    SHIM_KIND_VMM = 7,     /* a cuMemCreate allocation: key = shim's id; refs = handle + maps */
    SHIM_KIND_GRAPH_EXEC = 8 /* an executable graph's memory bound (graph_mem.h): key = exec */
};

struct shim_entry {
    uint64_t key;
    uint64_t bytes;  /* bytes charged (MAPPING: length of the mapping) */
    uint64_t peer;   /* MAPPING: the handle; DEVICE/ARRAY: the context */
    uint64_t pool;   /* DEVICE from a memory pool: the pool's id in pools.c; 0: none */
    int32_t gpu;     /* region GPU index charged, -1: not charged */
    int32_t device;  /* CUDA ordinal (charged entries, CONTEXT) */
    uint32_t refs;   /* VMM: 1 while its handle is not released + one per mapping and retain;
                      * HANDLE: its cuMemRetainAllocationHandle references not yet released */
    uint8_t kind;    /* enum shim_kind; 0: empty */
    uint8_t reserved[3];
};

/* Insert (or replace) the entry for (e->kind, e->key). Returns 0, or -1 if out of memory. */
int shim_table_put(const struct shim_entry *e);

/* Like shim_table_put, and the entry it replaced (if any) goes to `old`: 1 if there was one,
 * 0 if not, -1 if out of memory. */
int shim_table_put_replacing(const struct shim_entry *e, struct shim_entry *old);

/* Insert the entry for (e->kind, e->key) if the table holds none: 0; 1 if it holds one (left as
 * it is); -1 if out of memory. */
int shim_table_insert(const struct shim_entry *e);

/* Copy the entry for (kind, key) into `out`. Returns true if found. */
bool shim_table_get(enum shim_kind kind, uint64_t key, struct shim_entry *out);

/* Remove the entry for (kind, key), copying it into `out` (may be NULL). True if it was there. */
bool shim_table_take(enum shim_kind kind, uint64_t key, struct shim_entry *out);

/* Add `delta` to the refs of (kind, key); if they reach zero, remove the entry. The entry after
 * the change goes to `out`. Returns true if found. */
bool shim_table_add_refs(enum shim_kind kind, uint64_t key, int delta, struct shim_entry *out);

/* Remove every entry for which `match` is true, calling `removed` on each (outside no lock:
 * callbacks run under the shard's lock and must not use the table). Returns how many. */
int shim_table_sweep(bool (*match)(const struct shim_entry *e, void *arg),
                     void (*removed)(const struct shim_entry *e, void *arg), void *arg);

/* Number of entries (all kinds). */
uint64_t shim_table_count(void);

/* The lock of (kind, key) for keylock.h, on the line of the shard that holds the key's entry
 * (so that a free's key lock and table lookup share a line). Never taken by the table itself. */
struct shim_lock *shim_table_key_lock(enum shim_kind kind, uint64_t key);

/* fork(): take / release every key lock (keylock.c, before and after the gate). The child's are
 * free again with the rest of its table (shim_table_child_after_fork). */
void shim_table_lock_keys(void);
void shim_table_unlock_keys(void);

/* fork(): hold every shard across the fork; the child starts with an empty table (what the
 * parent holds is not the child's). */
void shim_table_prepare_fork(void);
void shim_table_parent_after_fork(void);
void shim_table_child_after_fork(void);

#endif
