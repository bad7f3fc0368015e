/*
 * Sharded open-addressing hash table (linear probing, backward-shift deletion, no tombstones).
 * Each shard grows independently at half load, so lookups stay O(1) at any size.
 */
#include <stdlib.h>
#include <string.h>

#include "lock.h"
#include "ptrtable.h"

#define SHARDS 64
#define MIN_CAPACITY 64

struct shard {
    struct shim_lock mu;
    struct shim_entry *slots; /* capacity is a power of two */
    uint64_t capacity;
    uint64_t count;
} __attribute__((aligned(64)));

static struct shard shards[SHARDS];

static inline uint64_t mix(enum shim_kind kind, uint64_t key)
{
    uint64_t x = key ^ ((uint64_t)kind << 58) ^ 0x9e3779b97f4a7c15ULL;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
    return x ^ (x >> 31);
}

static inline struct shard *shard_of(uint64_t h)
{
    return &shards[h >> 58];
}

/* Index of (kind, key) in `s`, or of the empty slot where it would go. */
static uint64_t find(const struct shard *s, enum shim_kind kind, uint64_t key, uint64_t h)
{
    uint64_t mask = s->capacity - 1;
    for (uint64_t i = h & mask;; i = (i + 1) & mask) {
        const struct shim_entry *e = &s->slots[i];
        if (e->kind == 0 || (e->kind == kind && e->key == key))
            return i;
    }
}

static int grow(struct shard *s)
{
    uint64_t cap = s->capacity ? s->capacity * 2 : MIN_CAPACITY;
    struct shim_entry *fresh = calloc(cap, sizeof *fresh);
    if (fresh == NULL)
        return -1;
    struct shim_entry *old = s->slots;
    uint64_t oldcap = s->capacity;
    s->slots = fresh;
    s->capacity = cap;
    for (uint64_t i = 0; i < oldcap; i++) {
        if (old[i].kind == 0)
            continue;
        uint64_t j = find(s, old[i].kind, old[i].key, mix(old[i].kind, old[i].key));
        s->slots[j] = old[i];
    }
    free(old);
    return 0;
}

/* Remove slot i, shifting later members of its probe run back (keeps lookups tombstone-free). */
static void erase(struct shard *s, uint64_t i)
{
    uint64_t mask = s->capacity - 1;
    uint64_t j = i;
    for (;;) {
        j = (j + 1) & mask;
        struct shim_entry *e = &s->slots[j];
        if (e->kind == 0)
            break;
        uint64_t home = mix(e->kind, e->key) & mask;
        /* Move e into the hole unless its home lies cyclically in (i, j]. */
        bool stays = (i <= j) ? (i < home && home <= j) : (i < home || home <= j);
        if (!stays) {
            s->slots[i] = *e;
            i = j;
        }
    }
    memset(&s->slots[i], 0, sizeof s->slots[i]);
    s->count--;
}

int shim_table_put_replacing(const struct shim_entry *e, struct shim_entry *old)
{
    uint64_t h = mix(e->kind, e->key);
    struct shard *s = shard_of(h);
    shim_lock(&s->mu);
    if ((s->count + 1) * 2 > s->capacity && grow(s) != 0) {
        shim_unlock(&s->mu);
        return -1;
    }
    uint64_t i = find(s, e->kind, e->key, h);
    int replaced = s->slots[i].kind != 0;
    if (replaced && old != NULL)
        *old = s->slots[i];
    if (!replaced)
        s->count++;
    s->slots[i] = *e;
    shim_unlock(&s->mu);
    return replaced;
}

int shim_table_put(const struct shim_entry *e)
{
    return shim_table_put_replacing(e, NULL) < 0 ? -1 : 0;
}

bool shim_table_get(enum shim_kind kind, uint64_t key, struct shim_entry *out)
{
    uint64_t h = mix(kind, key);
    struct shard *s = shard_of(h);
    shim_lock(&s->mu);
    bool found = false;
    if (s->capacity > 0) {
        uint64_t i = find(s, kind, key, h);
        if (s->slots[i].kind != 0) {
            found = true;
            if (out != NULL)
                *out = s->slots[i];
        }
    }
    shim_unlock(&s->mu);
    return found;
}

bool shim_table_take(enum shim_kind kind, uint64_t key, struct shim_entry *out)
{
    uint64_t h = mix(kind, key);
    struct shard *s = shard_of(h);
    shim_lock(&s->mu);
    bool found = false;
    if (s->capacity > 0) {
        uint64_t i = find(s, kind, key, h);
        if (s->slots[i].kind != 0) {
            found = true;
            if (out != NULL)
                *out = s->slots[i];
            erase(s, i);
        }
    }
    shim_unlock(&s->mu);
    return found;
}

bool shim_table_add_refs(enum shim_kind kind, uint64_t key, int delta, struct shim_entry *out)
{
    uint64_t h = mix(kind, key);
    struct shard *s = shard_of(h);
    shim_lock(&s->mu);
    bool found = false;
    if (s->capacity > 0) {
        uint64_t i = find(s, kind, key, h);
        struct shim_entry *e = &s->slots[i];
        if (e->kind != 0) {
            found = true;
            int64_t refs = (int64_t)e->refs + delta;
            e->refs = refs > 0 ? (uint32_t)refs : 0;
            if (out != NULL)
                *out = *e;
            if (e->refs == 0)
                erase(s, i);
        }
    }
    shim_unlock(&s->mu);
    return found;
}

int shim_table_sweep(bool (*match)(const struct shim_entry *e, void *arg),
                     void (*removed)(const struct shim_entry *e, void *arg), void *arg)
{
    int n = 0;
    for (int k = 0; k < SHARDS; k++) {
        struct shard *s = &shards[k];
        shim_lock(&s->mu);
        for (uint64_t i = 0; i < s->capacity;) {
            struct shim_entry *e = &s->slots[i];
            if (e->kind != 0 && match(e, arg)) {
                struct shim_entry copy = *e;
                erase(s, i); /* slot i now holds a shifted-back entry (or is empty): recheck */
                removed(&copy, arg);
                n++;
                continue;
            }
            i++;
        }
        shim_unlock(&s->mu);
    }
    return n;
}

uint64_t shim_table_count(void)
{
    uint64_t n = 0;
    for (int k = 0; k < SHARDS; k++) {
        shim_lock(&shards[k].mu);
        n += shards[k].count;
        shim_unlock(&shards[k].mu);
    }
    return n;
}

void shim_table_prepare_fork(void)
{
    for (int k = 0; k < SHARDS; k++)
        shim_lock(&shards[k].mu);
}

void shim_table_parent_after_fork(void)
{
    for (int k = SHARDS - 1; k >= 0; k--)
        shim_unlock(&shards[k].mu);
}

void shim_table_child_after_fork(void)
{
    for (int k = 0; k < SHARDS; k++) {
        shards[k].mu = (struct shim_lock)SHIM_LOCK_INIT;
        free(shards[k].slots);
        shards[k].slots = NULL;
        shards[k].capacity = 0;
        shards[k].count = 0;
    }
}
