/*
 * A mutex in one 32-bit word, for the locks every allocation and free takes (the pointer table's
 * shards, the key locks): uncontended, taking it is one compare-and-swap and releasing it one
 * exchange, inlined, where pthread_mutex_lock/unlock cost a call each and some seventy
 * instructions between them. Waiters sleep in the kernel (futex), so a lock held across a
 * driver call costs its waiters no CPU. The word is 0 (free), 1 (held) or 2 (held, maybe with
 * sleepers): U. Drepper, "Futexes are tricky", mutex 3. Process-private; after fork() the child
 * sets every word back to SHIM_LOCK_INIT (nothing of the parent's threads survives there).
 */
#ifndef TESSERA_LOCK_H
#define TESSERA_LOCK_H

#include <linux/futex.h>
#include <stdbool.h>
#include <stdint.h>
#include <sys/syscall.h>
#include <unistd.h>

struct shim_lock {
    uint32_t word;
};

#define SHIM_LOCK_INIT {0}

static __attribute__((noinline, cold, unused)) void shim_lock_wait(struct shim_lock *l,
                                                                   uint32_t seen)
{
    if (seen != 2)
        seen = __atomic_exchange_n(&l->word, 2, __ATOMIC_ACQUIRE);
    while (seen != 0) {
        syscall(SYS_futex, &l->word, FUTEX_WAIT_PRIVATE, 2, NULL, NULL, 0);
        seen = __atomic_exchange_n(&l->word, 2, __ATOMIC_ACQUIRE);
    }
}

static __attribute__((noinline, cold, unused)) void shim_lock_wake(struct shim_lock *l)
{
    syscall(SYS_futex, &l->word, FUTEX_WAKE_PRIVATE, 1, NULL, NULL, 0);
}

static inline void shim_lock(struct shim_lock *l)
{
    uint32_t seen = 0;
    if (__builtin_expect(!__atomic_compare_exchange_n(&l->word, &seen, 1, false, __ATOMIC_ACQUIRE,
                                                      __ATOMIC_RELAXED),
                         0))
        shim_lock_wait(l, seen);
}

static inline void shim_unlock(struct shim_lock *l)
{
    if (__builtin_expect(__atomic_exchange_n(&l->word, 0, __ATOMIC_RELEASE) != 1, 0))
        shim_lock_wake(l);
}

#endif
