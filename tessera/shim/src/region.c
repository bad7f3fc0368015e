/*
 * The usage region: a file shared (MAP_SHARED) by every process of a claim, holding each
 * process's device-memory usage per GPU and the compute controller's shared state. Layout and
 * protocol: tessera_shim.h. No lock lives in the region: counters change with atomic
 * instructions and slot ownership is an open file description lock (F_OFD_SETLK) the kernel drops
 * when its owner dies.
 *
 * Why a description's lock and not a process's (F_SETLK): a process has two halves that open the
 * region each through a descriptor of its own (the CUDA half, which owns the slot, and the NVML
 * half, which only sweeps), and may open the file for other reasons (a tool reading its usage).
 * A POSIX record lock belongs to the process: the NVML half's sweep "got" the lock of the CUDA
 * half's own slot without a conflict, freed the slot and unlocked the CUDA half's lock with its
 * own; closing any descriptor of the file dropped it too. A description's lock conflicts with
 * every other description, of this process or another, and is dropped only when the description
 * itself goes: when its descriptor is closed and its mapping unmapped, or its process dies.
 * A forked child shares its parent's description (through the descriptor and the MAP_SHARED
 * mapping), so it opens one of its own at once (tessera_region_after_fork_child).
 */
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <sched.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "create_once.h"
#include "fail.h"
#include "tessera_shim.h"

_Static_assert(sizeof(struct tessera_region_slot) == 192, "slot layout is part of the format");
_Static_assert(sizeof(struct tessera_region_gpu) == 192, "gpu layout is part of the format");
_Static_assert(offsetof(struct tessera_region, gpus) == 64, "header layout is part of the format");

#define LOAD(p) __atomic_load_n((p), __ATOMIC_SEQ_CST)
#define STORE(p, v) __atomic_store_n((p), (v), __ATOMIC_SEQ_CST)

/* Reaping takes other slots' locks through the handle's description, which the process's threads
 * share: a claiming thread and a reaping one must not interleave on one byte (the second would
 * "get" the lock the first holds, and one's unlock would end the other's hold). */
static pthread_mutex_t reap_mu = PTHREAD_MUTEX_INITIALIZER;

uint64_t tessera_now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ULL + (uint64_t)ts.tv_nsec;
}

static void init_header(struct tessera_region *r)
{
    memset(r, 0, sizeof *r);
    memcpy(r->magic, TESSERA_REGION_MAGIC, sizeof r->magic);
    r->version = TESSERA_REGION_VERSION;
    r->size = sizeof *r;
    r->max_gpus = TESSERA_MAX_GPUS;
    r->max_slots = TESSERA_REGION_SLOTS;
}

static int check_header(const struct tessera_region *r, const char *path, char *err, size_t errlen)
{
    if (memcmp(r->magic, TESSERA_REGION_MAGIC, sizeof r->magic) != 0)
        return tessera_fail(err, errlen, "%s: not a Tessera usage region (bad magic)", path);
    if (r->version != TESSERA_REGION_VERSION || r->size != sizeof *r ||
        r->max_gpus != TESSERA_MAX_GPUS || r->max_slots != TESSERA_REGION_SLOTS)
        return tessera_fail(err, errlen, "%s: usage region version %u (size %u) is not version %d",
                     path, r->version, r->size, TESSERA_REGION_VERSION);
    return 0;
}

int tessera_region_create(const char *path, char *err, size_t errlen)
{
    if (access(path, F_OK) == 0)
        return 0;
    struct tessera_region *r = calloc(1, sizeof *r);
    if (r == NULL)
        return tessera_fail(err, errlen, "out of memory");
    init_header(r);
    int rc = tessera_create_once(path, r, sizeof *r, err, errlen);
    free(r);
    return rc;
}

int tessera_region_open(const char *path, struct tessera_region_handle *h, char *err,
                        size_t errlen)
{
    h->map = NULL;
    h->fd = -1;
    h->slot = -1;
    if (tessera_region_create(path, err, errlen) != 0)
        return -1;
    int fd = open(path, O_RDWR | O_CLOEXEC);
    if (fd < 0)
        return tessera_fail(err, errlen, "%s: cannot open: %s", path, strerror(errno));
    struct stat st;
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode) || (size_t)st.st_size != sizeof *h->map) {
        close(fd);
        return tessera_fail(err, errlen, "%s: not a usage region of %zu bytes", path, sizeof *h->map);
    }
    void *map = mmap(NULL, sizeof *h->map, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (map == MAP_FAILED) {
        int e = errno;
        close(fd);
        return tessera_fail(err, errlen, "%s: cannot map: %s", path, strerror(e));
    }
    if (check_header(map, path, err, errlen) != 0) {
        munmap(map, sizeof *h->map);
        close(fd);
        return -1;
    }
    h->map = map;
    h->fd = fd;
    return 0;
}

int tessera_region_open_private(struct tessera_region_handle *h, char *err, size_t errlen)
{
    h->map = NULL;
    h->fd = -1;
    h->slot = -1;
    int fd = memfd_create("tessera-usage", MFD_CLOEXEC);
    if (fd < 0)
        return tessera_fail(err, errlen, "cannot create a private usage region: %s", strerror(errno));
    if (ftruncate(fd, sizeof *h->map) != 0) {
        int e = errno;
        close(fd);
        return tessera_fail(err, errlen, "cannot size a private usage region: %s", strerror(e));
    }
    void *map = mmap(NULL, sizeof *h->map, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (map == MAP_FAILED) {
        int e = errno;
        close(fd);
        return tessera_fail(err, errlen, "cannot map a private usage region: %s", strerror(e));
    }
    init_header(map);
    h->map = map;
    h->fd = fd;
    return 0;
}

void tessera_region_close(struct tessera_region_handle *h)
{
    if (h->map != NULL)
        munmap(h->map, sizeof *h->map);
    if (h->fd >= 0)
        close(h->fd);
    h->map = NULL;
    h->fd = -1;
    h->slot = -1;
}

int tessera_region_gpu(struct tessera_region *r, const char *uuid)
{
    for (int i = 0; i < TESSERA_MAX_GPUS; i++) {
        struct tessera_region_gpu *g = &r->gpus[i];
        for (int spins = 0;; spins++) {
            uint32_t state = __atomic_load_n(&g->state, __ATOMIC_ACQUIRE);
            if (state == TESSERA_GPU_READY) {
                if (strncmp(g->uuid, uuid, TESSERA_UUID_MAX) == 0)
                    return i;
                break;
            }
            if (state == TESSERA_GPU_FREE) {
                uint32_t expect = TESSERA_GPU_FREE;
                if (__atomic_compare_exchange_n(&g->state, &expect, TESSERA_GPU_WRITING, false,
                                                __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE)) {
                    snprintf(g->uuid, sizeof g->uuid, "%s", uuid);
                    __atomic_store_n(&g->state, TESSERA_GPU_READY, __ATOMIC_RELEASE);
                    return i;
                }
                continue;
            }
            /* WRITING: another process is naming this entry (a few stores). One that died in
             * between would leave it so; after a second, give up rather than hang. */
            if (spins > 10000)
                return -1;
            struct timespec pause = {0, 100000};
            nanosleep(&pause, NULL);
        }
    }
    return -1;
}

/* Whether `fd` names a usage region whose header is the one mapped at `map`. An application may
 * close descriptors it did not open (a daemon closes all) and the number come back naming another
 * file: every lock a sweep took through it would succeed and free every live slot, and a forked
 * child would map that file in the region's place. So the descriptor is checked before each use
 * (a sweep runs at most every 100 ms): a regular file of the region's size, reading back the
 * header that is mapped. */
static bool names_region(int fd, const struct tessera_region *map)
{
    struct stat st;
    if (fd < 0 || fstat(fd, &st) != 0 || !S_ISREG(st.st_mode) || (size_t)st.st_size != sizeof *map)
        return false;
    char head[offsetof(struct tessera_region, slot_hwm)]; /* magic to max_slots: never change */
    ssize_t got;
    do
        got = pread(fd, head, sizeof head, 0);
    while (got < 0 && errno == EINTR);
    return got == (ssize_t)sizeof head && memcmp(head, map, sizeof head) == 0;
}

/* F_OFD_SETLK on one byte: 0 = got it, 1 = held through another open file description, -1 =
 * error (no descriptor, say). */
static int lock_byte(int fd, int slot, short type)
{
    struct flock fl = {.l_type = type, .l_whence = SEEK_SET,
                       .l_start = TESSERA_REGION_LOCK_BASE + slot, .l_len = 1, .l_pid = 0};
    if (fd < 0)
        return -1;
    while (fcntl(fd, F_OFD_SETLK, &fl) != 0) {
        if (errno == EINTR)
            continue;
        return (errno == EAGAIN || errno == EACCES) ? 1 : -1;
    }
    return 0;
}

static uint64_t self_start_time(void)
{
    char buf[1024];
    int fd = open("/proc/self/stat", O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return 0;
    ssize_t n = read(fd, buf, sizeof buf - 1);
    close(fd);
    if (n <= 0)
        return 0;
    buf[n] = '\0';
    /* Fields after the command name, which ends at the last ')': the blank after it precedes
     * field 3 (state); step from blank to blank until the one before field 22 (starttime). */
    char *p = strrchr(buf, ')');
    if (p == NULL)
        return 0;
    p++;
    for (int field = 3; field < 22 && p != NULL; field++)
        p = strchr(p + 1, ' ');
    return p != NULL ? strtoull(p + 1, NULL, 10) : 0;
}

static void zero_usage(struct tessera_region_slot *s)
{
    for (int g = 0; g < TESSERA_MAX_GPUS; g++)
        STORE(&s->used[g], 0);
}

int tessera_region_claim_slot(struct tessera_region_handle *h)
{
    struct tessera_region *r = h->map;
    if (!names_region(h->fd, r))
        return -2;
    /* Held until h->slot names the slot: a reaping thread of ours may otherwise hold byte i, or
     * take it (same description: no conflict) between our lock and the slot becoming ours. */
    pthread_mutex_lock(&reap_mu);
    for (int i = 0; i < TESSERA_REGION_SLOTS; i++) {
        if (lock_byte(h->fd, i, F_WRLCK) != 0)
            continue;
        struct tessera_region_slot *s = &r->slots[i];
        zero_usage(s); /* left ACTIVE by a dead process nobody reaped yet */
        s->pid = (int32_t)getpid();
        s->start_time = self_start_time();
        STORE(&s->state, TESSERA_SLOT_ACTIVE);
        uint32_t hwm = LOAD(&r->slot_hwm);
        while (hwm < (uint32_t)i + 1 &&
               !__atomic_compare_exchange_n(&r->slot_hwm, &hwm, (uint32_t)i + 1, false,
                                            __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST))
            ;
        h->slot = i;
        pthread_mutex_unlock(&reap_mu);
        return i;
    }
    pthread_mutex_unlock(&reap_mu);
    return -1;
}

uint64_t tessera_region_used(const struct tessera_region *r, int gpu)
{
    uint32_t hwm = __atomic_load_n(&r->slot_hwm, __ATOMIC_SEQ_CST);
    if (hwm > TESSERA_REGION_SLOTS)
        hwm = TESSERA_REGION_SLOTS;
    uint64_t total = 0;
    for (uint32_t i = 0; i < hwm; i++) {
        uint64_t v = __atomic_load_n(&r->slots[i].used[gpu], __ATOMIC_SEQ_CST);
        total = total + v < total ? UINT64_MAX : total + v;
    }
    return total;
}

/* Subtract with a floor of zero: a slot zeroed under its owner (a tenant writing the shared
 * file) must never wrap around. */
static void sub_saturating(uint64_t *p, uint64_t bytes)
{
    uint64_t old = __atomic_load_n(p, __ATOMIC_SEQ_CST);
    uint64_t next;
    do {
        next = old > bytes ? old - bytes : 0;
    } while (!__atomic_compare_exchange_n(p, &old, next, false, __ATOMIC_SEQ_CST,
                                          __ATOMIC_SEQ_CST));
}

int tessera_region_reserve(struct tessera_region_handle *h, int gpu, uint64_t bytes,
                           uint64_t limit)
{
    if (bytes == 0)
        return 0;
    if (h->slot < 0 || gpu < 0 || gpu >= TESSERA_MAX_GPUS || bytes > limit)
        return -1;
    uint64_t *mine = &h->map->slots[h->slot].used[gpu];
    bool reaped = false;
    for (int attempt = 0; attempt < 64; attempt++) {
        /* Add first, then look at the sum: of two racing reservations at least one sees the
         * other's addition (sequentially consistent order), so they cannot both pass. */
        __atomic_add_fetch(mine, bytes, __ATOMIC_SEQ_CST);
        uint64_t total = tessera_region_used(h->map, gpu);
        if (total <= limit)
            return 0;
        sub_saturating(mine, bytes);
        uint64_t others = tessera_region_used(h->map, gpu);
        if (others <= limit - bytes) {
            /* It fits without a racing reservation that has since backed off: try again. */
            if (attempt > 4)
                sched_yield();
            continue;
        }
        if (reaped)
            return -1;
        reaped = true;
        if (tessera_region_reap(h) == 0)
            return -1;
    }
    return -1;
}

void tessera_region_release(struct tessera_region_handle *h, int gpu, uint64_t bytes)
{
    if (bytes == 0 || h->slot < 0 || gpu < 0 || gpu >= TESSERA_MAX_GPUS)
        return;
    sub_saturating(&h->map->slots[h->slot].used[gpu], bytes);
}

int tessera_region_reap(struct tessera_region_handle *h)
{
    struct tessera_region *r = h->map;
    int reaped = 0;
    if (!names_region(h->fd, r))
        return 0;
    pthread_mutex_lock(&reap_mu);
    uint32_t hwm = LOAD(&r->slot_hwm);
    if (hwm > TESSERA_REGION_SLOTS)
        hwm = TESSERA_REGION_SLOTS;
    for (uint32_t i = 0; i < hwm; i++) {
        struct tessera_region_slot *s = &r->slots[i];
        if ((int)i == h->slot || LOAD(&s->state) != TESSERA_SLOT_ACTIVE)
            continue;
        if (lock_byte(h->fd, (int)i, F_WRLCK) != 0)
            continue; /* alive (or a claimer is taking it over) */
        if (LOAD(&s->state) == TESSERA_SLOT_ACTIVE) {
            zero_usage(s);
            STORE(&s->state, TESSERA_SLOT_FREE);
            reaped++;
        }
        lock_byte(h->fd, (int)i, F_UNLCK);
    }
    STORE(&r->last_reap_ns, tessera_now_ns());
    pthread_mutex_unlock(&reap_mu);
    return reaped;
}

/* CLOCK_MONOTONIC to the last tick: a few ns where reading the precise clock takes 25 on the
 * allocation path, and precise enough for sweeps hundreds of milliseconds apart. */
static uint64_t coarse_now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC_COARSE, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ULL + (uint64_t)ts.tv_nsec;
}

/* A sweep is due (the last was stamped `last`): one process per interval does it. Out of line, so
 * that the check every allocation makes keeps a small frame. */
static __attribute__((noinline)) void sweep_due(struct tessera_region_handle *h, uint64_t now,
                                                uint64_t last)
{
    if (!names_region(h->fd, h->map))
        return; /* cannot sweep: leave the interval's sweep to a process that can */
    if (__atomic_compare_exchange_n(&h->map->last_reap_ns, &last, now, false, __ATOMIC_SEQ_CST,
                                    __ATOMIC_SEQ_CST))
        tessera_region_reap(h);
}

void tessera_region_maybe_reap(struct tessera_region_handle *h, uint64_t interval_ns)
{
    uint64_t now = coarse_now_ns();
    uint64_t last = LOAD(&h->map->last_reap_ns);
    /* A sweep stamped by the precise clock, which runs up to a tick ahead, is recent too; one
     * stamped further ahead than an interval (before a reboot) is not. */
    if (now - last < interval_ns || last - now < interval_ns)
        return;
    sweep_due(h, now, last);
}

/* Replace the description the child shares with its parent by one of its own, over the same
 * file (reopened through /proc, so the very inode, a private region's anonymous file included)
 * and at the same address, so pointers into the map stay valid. Only system calls: the child of
 * a multithreaded parent may run nothing else before exec. */
static int own_description(struct tessera_region_handle *h)
{
    char path[32] = "/proc/self/fd/";
    char digits[12];
    int n = 0;
    for (unsigned v = (unsigned)h->fd; n == 0 || v > 0; v /= 10)
        digits[n++] = (char)('0' + v % 10);
    size_t at = strlen(path);
    while (n > 0)
        path[at++] = digits[--n];
    path[at] = '\0';
    int fd = open(path, O_RDWR | O_CLOEXEC);
    if (fd < 0)
        return -1;
    if (!names_region(fd, h->map)) { /* the number names another file now: map nothing of it */
        close(fd);
        return -1;
    }
    void *map = mmap(h->map, sizeof *h->map, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_FIXED, fd, 0);
    if (map == MAP_FAILED) {
        close(fd);
        return -1;
    }
    /* The mapping no longer holds the parent's description; neither does the descriptor once
     * it is this one under the same number. */
    int rc = dup3(fd, h->fd, O_CLOEXEC) < 0 ? -1 : 0;
    close(fd);
    return rc;
}

int tessera_region_after_fork_child(struct tessera_region_handle *h)
{
    pthread_mutex_t fresh = PTHREAD_MUTEX_INITIALIZER;
    reap_mu = fresh;
    h->slot = -1; /* the parent's slot stays the parent's */
    if (h->map == NULL || h->fd < 0 || own_description(h) == 0)
        return 0;
    /* Sharing the parent's description, this process could take the parent's slot (or any
     * other it holds) without a conflict: it takes no slot and sweeps nothing. A number that
     * names another file now is the application's to close, not ours. */
    if (names_region(h->fd, h->map))
        close(h->fd);
    h->fd = -1;
    return -1;
}

void tessera_region_drop_usage(struct tessera_region_handle *h)
{
    if (h->map != NULL && h->slot >= 0)
        zero_usage(&h->map->slots[h->slot]);
}
