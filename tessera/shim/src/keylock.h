/*
 * Ordering the shim's bookkeeping with the driver's answers, so that what the pointer table
 * holds is what the driver holds after any interleaving of allocations and frees, valid or not.
 *
 *  - Every free-like call of one key (a device pointer, an array, a VMM handle, a mapped
 *    address) runs under that key's lock, from the table lookup to the settlement of the
 *    driver's answer. Concurrent frees of one pointer therefore reach the driver one at a time:
 *    the first finds the entry and is refunded if the driver frees; the rest find none.
 *  - An allocation holds the allocation gate (shared) from just before the driver call until its
 *    entry is in the table. A free of a key the table does not hold closes the gate (waits for
 *    every allocation in flight to be recorded), looks again, and keeps the gate closed across
 *    its own driver call: so a stale free cannot free an allocation that the driver has handed
 *    out but the shim has not recorded yet, which would leave that allocation charged forever.
 *
 * Lock order: a key's lock, then the gate, then the pointer table's shards.
 */
#ifndef TESSERA_KEYLOCK_H
#define TESSERA_KEYLOCK_H

#include <stdint.h>

#include "ptrtable.h"

/* Hold the lock of (kind, key); returns it for shim_key_unlock (sparing a second hash). */
struct shim_lock *shim_key_lock(enum shim_kind kind, uint64_t key);
void shim_key_unlock(struct shim_lock *held);

/* An allocation's driver call and its recording in the table (shared; never nested). */
void shim_gate_enter(void);
void shim_gate_leave(void);

/* A free of a key the table does not hold (exclusive; under the key's lock). */
void shim_gate_close(void);
void shim_gate_open(void);

/* fork(): hold every lock across the fork; the child starts with all of them free. */
void shim_keylock_prepare_fork(void);
void shim_keylock_parent_after_fork(void);
void shim_keylock_child_after_fork(void);

#endif
