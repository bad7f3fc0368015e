/*
 * Sharded hash table in two parts per shard: an index of 8-byte cells (open addressing, linear
 * probing, backward-shift deletion, no tombstones), each the key's hash tag and where its entry
 * is, and the entries in an array, one cache line each, whose free places are reused last freed
 * first. Each shard
 * grows independently at half load, so lookups stay O(1) at any size. Why not whole entries in
 * the probed array: at 10 000 live allocations that array (1.5 MB) does not stay in the CPU's
 * cache, and every insert missed on a random line of it - most of what an allocation cost. The
 * index at that size is 256 KB, and an allocation's entry goes where the last free's was.
 */
#include <stdlib.h>
#include <string.h>

#include "lock.h"
#include "ptrtable.h"

#define SHARDS 64
#define MIN_CELLS 64 /* a power of two */
#define MIN_ENTRIES 32
#define MAX_ENTRIES (1U << 31) /* entry numbers fit a cell's 32 bits */
#define SHIM_TABLE_LIKELY(x) __builtin_expect(!!(x), 1)

/* An entry on a cache line of its own: its 48 bytes packed end to end straddled two lines every
 * other entry, and a lookup after the driver's work had evicted the table read both. */
struct place {
    struct shim_entry e;
} __attribute__((aligned(64)));

/* A shard's header is one cache line, which also holds the key locks (keylock.h) of the keys
 * whose entries the shard holds: a free takes its key's lock and then the shard's, and after
 * the driver's work has evicted both, one line is one miss where two lines were two. */
#define KEY_LOCKS 4 /* per shard: a power of two */

struct shard {
    struct shim_lock mu;
    uint32_t count;     /* live entries */
    uint32_t free_head; /* 1 + the entry freed last, whose key holds the next so; 0: none */
    uint32_t top;       /* entries[0, top) have been handed out */
    uint32_t capacity;  /* of entries */
    struct shim_lock keys[KEY_LOCKS];
    uint64_t cells;     /* of index: a power of two */
    uint64_t *index;    /* (uint32_t)hash << 32 | (1 + entry); 0: empty */
    struct place *entries;
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

_Static_assert(sizeof(struct shard) == 64, "a shard's header is one cache line");

static inline uint64_t tag_of(uint64_t cell)
{
    return cell >> 32;
}

static inline struct shim_entry *entry_of(const struct shard *s, uint64_t cell)
{
    return &s->entries[(uint32_t)cell - 1].e;
}

/* Index of the cell of (kind, key) in `s`, or of the empty cell where it would go. Entries are
 * read only where the tag (32 bits of the hash) matches. */
static inline __attribute__((always_inline)) uint64_t find(const struct shard *s, enum shim_kind kind, uint64_t key, uint64_t h)
{
    uint64_t mask = s->cells - 1;
    for (uint64_t i = h & mask;; i = (i + 1) & mask) {
        uint64_t c = s->index[i];
        if (c == 0)
            return i;
        if (tag_of(c) == (uint32_t)h) {
            const struct shim_entry *e = entry_of(s, c);
            if (e->kind == kind && e->key == key)
                return i;
        }
    }
}

/* Make room for one more entry: a larger index at half load, a larger entry array when no
 * freed place is left. Returns 0, or -1 if out of memory (nothing changed). Out of line: an
 * insert that needs neither (nearly all) keeps this frame off its stack. */
static __attribute__((noinline)) int grow(struct shard *s)
{
    if (s->free_head == 0 && s->top == s->capacity) {
        if (s->capacity >= MAX_ENTRIES)
            return -1;
        uint32_t cap = s->capacity ? s->capacity * 2 : MIN_ENTRIES;
        struct place *more = aligned_alloc(sizeof *more, (size_t)cap * sizeof *more);
        if (more == NULL)
            return -1;
        if (s->top > 0)
            memcpy(more, s->entries, (size_t)s->top * sizeof *more);
        free(s->entries);
        s->entries = more;
        s->capacity = cap;
    }
    if ((uint64_t)(s->count + 1) * 2 <= s->cells)
        return 0;
    uint64_t cells = s->cells ? s->cells * 2 : MIN_CELLS;
    uint64_t *fresh = calloc(cells, sizeof *fresh);
    if (fresh == NULL)
        return -1;
    for (uint64_t i = 0; i < s->cells; i++) {
        uint64_t c = s->index[i];
        if (c == 0)
            continue;
        uint64_t j = tag_of(c) & (cells - 1);
        while (fresh[j] != 0)
            j = (j + 1) & (cells - 1);
        fresh[j] = c;
    }
    free(s->index);
    s->index = fresh;
    s->cells = cells;
    return 0;
}

static inline int reserve(struct shard *s)
{
    if (SHIM_TABLE_LIKELY((s->free_head != 0 || s->top < s->capacity) &&
                          (uint64_t)(s->count + 1) * 2 <= s->cells))
        return 0;
    return grow(s);
}

/* A place for a new entry (reserve() made sure there is one): the one freed last, whose lines
 * the free just touched, else the next never used. */
static uint32_t take_place(struct shard *s)
{
    if (s->free_head == 0)
        return s->top++;
    uint32_t n = s->free_head - 1;
    s->free_head = (uint32_t)s->entries[n].e.key;
    return n;
}

/* Remove cell i and its entry, shifting later members of the cell's probe run back (keeps
 * lookups tombstone-free). */
static void erase(struct shard *s, uint64_t i)
{
    uint32_t n = (uint32_t)s->index[i] - 1;
    s->entries[n].e.kind = 0; /* free (shim_table_sweep skips it) */
    s->entries[n].e.key = s->free_head;
    s->free_head = n + 1;
    uint64_t mask = s->cells - 1;
    uint64_t j = i;
    for (;;) {
        j = (j + 1) & mask;
        uint64_t c = s->index[j];
        if (c == 0)
            break;
        uint64_t home = tag_of(c) & mask;
        /* Move c into the hole unless its home lies cyclically in (i, j]. */
        bool stays = (i <= j) ? (i < home && home <= j) : (i < home || home <= j);
        if (!stays) {
            s->index[i] = c;
            i = j;
        }
    }
    s->index[i] = 0;
    s->count--;
}

/* Put `e` in its shard: replacing the entry for its key (copied to `old`, if not NULL) if
 * `replace`, else leaving it. 1 if there was one, 0 if not, -1 if out of memory. */
static inline __attribute__((always_inline)) int put(const struct shim_entry *e,
                                                     struct shim_entry *old, bool replace)
{
    uint64_t h = mix(e->kind, e->key);
    struct shard *s = shard_of(h);
    shim_lock(&s->mu);
    if (reserve(s) != 0) {
        shim_unlock(&s->mu);
        return -1;
    }
    uint64_t i = find(s, e->kind, e->key, h);
    int there = s->index[i] != 0;
    if (there) {
        if (old != NULL)
            *old = *entry_of(s, s->index[i]);
    } else {
        uint32_t n = take_place(s);
        s->index[i] = (uint64_t)(uint32_t)h << 32 | (n + 1);
        s->count++;
    }
    if (!there || replace)
        *entry_of(s, s->index[i]) = *e;
    shim_unlock(&s->mu);
    return there;
}

int shim_table_put_replacing(const struct shim_entry *e, struct shim_entry *old)
{
    return put(e, old, true);
}

int shim_table_insert(const struct shim_entry *e)
{
    return put(e, NULL, false);
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
    if (s->cells > 0) {
        uint64_t i = find(s, kind, key, h);
        if (s->index[i] != 0) {
            found = true;
            if (out != NULL)
                *out = *entry_of(s, s->index[i]);
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
    if (s->cells > 0) {
        uint64_t i = find(s, kind, key, h);
        if (s->index[i] != 0) {
            found = true;
            if (out != NULL)
                *out = *entry_of(s, s->index[i]);
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
    if (s->cells > 0) {
        uint64_t i = find(s, kind, key, h);
        if (s->index[i] != 0) {
            struct shim_entry *e = entry_of(s, s->index[i]);
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
        for (uint32_t m = 0; m < s->top; m++) {
            const struct shim_entry *e = &s->entries[m].e;
            if (e->kind == 0 || !match(e, arg))
                continue;
            struct shim_entry copy = *e;
            erase(s, find(s, copy.kind, copy.key, mix(copy.kind, copy.key)));
            removed(&copy, arg);
            n++;
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

struct shim_lock *shim_table_key_lock(enum shim_kind kind, uint64_t key)
{
    uint64_t h = mix(kind, key);
    return &shard_of(h)->keys[(h >> 56) & (KEY_LOCKS - 1)];
}

void shim_table_lock_keys(void)
{
    for (int k = 0; k < SHARDS; k++)
        for (int i = 0; i < KEY_LOCKS; i++)
            shim_lock(&shards[k].keys[i]);
}

void shim_table_unlock_keys(void)
{
    for (int k = SHARDS - 1; k >= 0; k--)
        for (int i = KEY_LOCKS - 1; i >= 0; i--)
            shim_unlock(&shards[k].keys[i]);
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
        free(shards[k].index);
        free(shards[k].entries);
        shards[k] = (struct shard){.mu = SHIM_LOCK_INIT};
    }
}
