/*
 * Device-memory accounting: every allocation is charged to the claim in the usage region before
 * the real driver is asked for it, and the charge is recorded in the pointer table so that the
 * matching free (by any path) gives back exactly what was taken.
 */
#ifndef TESSERA_MEMORY_H
#define TESSERA_MEMORY_H

#include <stdint.h>

#include "ptrtable.h"
#include "shim_state.h"

/* A reservation in progress. gpu < 0: nothing charged (device not limited, or no limits). */
struct shim_charge {
    int gpu;
    int device; /* the CUDA ordinal charged */
    uint64_t bytes;
    uint64_t limit; /* the claim's limit on gpu (while gpu >= 0) */
    CUcontext ctx;
    uint64_t pool; /* the pool allocated from (pools.c's id), 0: none */
    bool gated;    /* holds the allocation gate (keylock.h) until committed or aborted */
};

/* Reserve `bytes` on device `dev` (-1: the current context's device). CUDA_SUCCESS, or
 * CUDA_ERROR_OUT_OF_MEMORY if the claim's limit would be exceeded even after the process's
 * memory pools on the device gave back what they cache (pools.h), and then its graph memory
 * cache (graph_mem.h). While a memory limit is in
 * force a begun charge holds the allocation gate (keylock.h) until it is committed or aborted:
 * call the driver between the two, and nothing that begins another charge. */
CUresult shim_charge_begin(struct shim_charge *c, int dev, uint64_t bytes);

/* Change the reservation to `bytes` (the driver reported the real size). Returns false (and
 * keeps the old amount) if the claim cannot take the increase. */
bool shim_charge_resize(struct shim_charge *c, uint64_t bytes);

/* `bytes` of the reservation now belong to another account (a pool's cache, pools.h): the
 * charge keeps the rest and the claim's total is unchanged. */
void shim_charge_hand_over(struct shim_charge *c, uint64_t bytes);

/* The real call succeeded: remember that `key` holds the reservation (while a memory limit is
 * in force, also when nothing was charged, so that its free is known to be a valid one). An
 * entry the table still held for `key` is stale (the driver handed the key out again): it is
 * given back. */
void shim_charge_commit(struct shim_charge *c, enum shim_kind kind, uint64_t key);

/* The real call, `call(arg)`, failed with CUDA_ERROR_OUT_OF_MEMORY: make it again, pausing between
 * tries, while it fails so and for at most TESSERA_OOM_WAIT_NS; returns its last answer. Only for
 * a reservation the claim's limit had room for (the GPU's memory was taken around the shim, by a
 * process the node stops within seconds); for an allocation nothing was charged for, returns
 * CUDA_ERROR_OUT_OF_MEMORY at once. Out of line and cold: the allocation's fast path pays only
 * the comparison that leads here. Abort the charge if it still failed. */
CUresult shim_charge_retry(struct shim_charge *c, CUresult (*call)(void *), void *arg);

/* The real call failed: give the reservation back. */
void shim_charge_abort(struct shim_charge *c);

/* Give back the bytes an entry was charged. */
void shim_uncharge(const struct shim_entry *e);

/* Free every DEVICE and ARRAY entry of context `ctx` (the context was destroyed). */
void shim_uncharge_context(CUcontext ctx);

#endif
