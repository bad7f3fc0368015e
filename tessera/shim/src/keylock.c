/* Key locks and the allocation gate (keylock.h). */
#include <pthread.h>

#include "keylock.h"
#include "lock.h"

#define STRIPES 256 /* a power of two */

struct stripe {
    struct shim_lock mu;
} __attribute__((aligned(64)));

static struct stripe stripes[STRIPES];

/* Writer-preferring: a free waiting to close the gate is not starved by a stream of
 * allocations (readers never nest, so the preference cannot deadlock a reader). Aligned: its
 * 56 bytes on one cache line, not two, as every allocation reads it. */
static pthread_rwlock_t gate __attribute__((aligned(64))) =
    PTHREAD_RWLOCK_WRITER_NONRECURSIVE_INITIALIZER_NP;

static inline struct stripe *stripe_of(enum shim_kind kind, uint64_t key)
{
    uint64_t x = (key >> 4) ^ ((uint64_t)kind << 59) ^ 0x9e3779b97f4a7c15ULL;
    x = (x ^ (x >> 31)) * 0xbf58476d1ce4e5b9ULL;
    x ^= x >> 29;
    return &stripes[x & (STRIPES - 1)];
}

void shim_key_lock(enum shim_kind kind, uint64_t key)
{
    shim_lock(&stripe_of(kind, key)->mu);
}

void shim_key_unlock(enum shim_kind kind, uint64_t key)
{
    shim_unlock(&stripe_of(kind, key)->mu);
}

void shim_gate_enter(void)
{
    pthread_rwlock_rdlock(&gate);
}

void shim_gate_leave(void)
{
    pthread_rwlock_unlock(&gate);
}

void shim_gate_close(void)
{
    pthread_rwlock_wrlock(&gate);
}

void shim_gate_open(void)
{
    pthread_rwlock_unlock(&gate);
}

void shim_keylock_prepare_fork(void)
{
    for (int i = 0; i < STRIPES; i++)
        shim_lock(&stripes[i].mu);
    pthread_rwlock_wrlock(&gate);
}

void shim_keylock_parent_after_fork(void)
{
    pthread_rwlock_unlock(&gate);
    for (int i = STRIPES - 1; i >= 0; i--)
        shim_unlock(&stripes[i].mu);
}

void shim_keylock_child_after_fork(void)
{
    pthread_rwlock_t fresh_gate = PTHREAD_RWLOCK_WRITER_NONRECURSIVE_INITIALIZER_NP;
    gate = fresh_gate;
    for (int i = 0; i < STRIPES; i++)
        stripes[i].mu = (struct shim_lock)SHIM_LOCK_INIT;
}
