/* Key locks and the allocation gate (keylock.h). */
#include <limits.h>

#include "keylock.h"
#include "lock.h"

#define SHIM_GATE_LIKELY(x) __builtin_expect(!!(x), 1)
#define SHIM_GATE_UNLIKELY(x) __builtin_expect(!!(x), 0)

/* The allocation gate, writer-preferring: a free waiting to close it is not starved by a
 * stream of allocations (readers never nest, so the preference cannot deadlock a reader). Two
 * words on one cache line, entered with one atomic add and a load: the allocation path touches
 * this line and no other (glibc's rwlock also read the thread's descriptor, a second line that
 * was a cold miss on every allocation after the driver's work). A reader counts itself in, then
 * looks for a writer; a writer marks itself, then waits for the count to drain: with
 * sequentially consistent order at least one of the two sees the other. Writers take turns on
 * `writers`, held while the gate is closed. */
static struct {
    uint32_t readers; /* allocations inside */
    uint32_t closed;  /* 0: open; 1: a writer holds or is closing it; 2: ... and readers may
                         be asleep on this word */
    struct shim_lock writers;
} gate __attribute__((aligned(64)));

static __attribute__((noinline, cold)) void gate_wait_open(void)
{
    uint32_t seen = 1;
    while (seen != 0) {
        /* Mark that a reader sleeps (2), so that opening wakes only when one may. */
        if (seen == 2 || __atomic_compare_exchange_n(&gate.closed, &seen, 2, false,
                                                     __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST))
            syscall(SYS_futex, &gate.closed, FUTEX_WAIT_PRIVATE, 2, NULL, NULL, 0);
        seen = __atomic_load_n(&gate.closed, __ATOMIC_SEQ_CST);
    }
}

/* The key locks are the pointer table's (on its shards' lines, ptrtable.h). */
struct shim_lock *shim_key_lock(enum shim_kind kind, uint64_t key)
{
    struct shim_lock *l = shim_table_key_lock(kind, key);
    shim_lock(l);
    return l;
}

void shim_key_unlock(struct shim_lock *held)
{
    shim_unlock(held);
}

static __attribute__((noinline, cold)) void gate_wake_writer(void)
{
    syscall(SYS_futex, &gate.readers, FUTEX_WAKE_PRIVATE, 1, NULL, NULL, 0);
}

void shim_gate_enter(void)
{
    for (;;) {
        __atomic_add_fetch(&gate.readers, 1, __ATOMIC_SEQ_CST);
        if (SHIM_GATE_LIKELY(__atomic_load_n(&gate.closed, __ATOMIC_SEQ_CST) == 0))
            return;
        shim_gate_leave(); /* a writer is closing it: let it, and wait until it opens */
        gate_wait_open();
    }
}

void shim_gate_leave(void)
{
    if (__atomic_sub_fetch(&gate.readers, 1, __ATOMIC_SEQ_CST) == 0 &&
        SHIM_GATE_UNLIKELY(__atomic_load_n(&gate.closed, __ATOMIC_SEQ_CST) != 0))
        gate_wake_writer();
}

void shim_gate_close(void)
{
    shim_lock(&gate.writers);
    __atomic_store_n(&gate.closed, 1, __ATOMIC_SEQ_CST);
    for (uint32_t n; (n = __atomic_load_n(&gate.readers, __ATOMIC_SEQ_CST)) != 0;)
        syscall(SYS_futex, &gate.readers, FUTEX_WAIT_PRIVATE, n, NULL, NULL, 0);
}

void shim_gate_open(void)
{
    if (__atomic_exchange_n(&gate.closed, 0, __ATOMIC_SEQ_CST) == 2)
        syscall(SYS_futex, &gate.closed, FUTEX_WAKE_PRIVATE, INT_MAX, NULL, NULL, 0);
    shim_unlock(&gate.writers);
}

void shim_keylock_prepare_fork(void)
{
    shim_table_lock_keys();
    shim_gate_close();
}

void shim_keylock_parent_after_fork(void)
{
    shim_gate_open();
    shim_table_unlock_keys();
}

void shim_keylock_child_after_fork(void)
{
    gate.readers = 0;
    gate.closed = 0;
    gate.writers = (struct shim_lock)SHIM_LOCK_INIT;
    /* The key locks start over with the child's table (shim_table_child_after_fork). */
}
