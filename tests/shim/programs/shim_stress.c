/*
 * Accounting under any interleaving: the shim's usage against the driver's own. Runs unchanged
 * on a real GPU. Results are "key=value" lines.
 *
 *   shim_stress doublefree THREADS BYTES ROUNDS
 *       ROUNDS times: allocate BYTES, then THREADS threads cuMemFree_v2 it at once. Reports
 *       how many frees the driver let succeed (freed=), the shim's and the driver's usage after
 *       it all, and the answer to allocating the whole limit at the end (full_rc=).
 *
 *   shim_stress stress PROCS THREADS ROUNDS OPS SEED
 *       PROCS processes of THREADS threads each, every thread OPS random operations a round
 *       (allocations, frees, double frees, frees of stale pointers that another thread's
 *       allocation may have reused - stream-ordered ones included -, frees of unknown pointers,
 *       frees from another context, stream-ordered allocations and (double) frees whose memory
 *       the pool caches, VMM create/map/unmap/release). The operations follow from SEED (the
 *       schedule does not). At the end each process trims its pool.
 *       After each round every thread of every process waits at a barrier; then the first
 *       process prints "round=R shim=S driver=D" (the claim's usage as the shim reports it, and
 *       the GPU's as the driver itself reports it, both in bytes, the driver's less what it
 *       held before the first round). At the end everything is freed, the last round is
 *       printed as "end", and allocating the whole limit is tried (full_rc=).
 *
 *   shim_stress unseen BYTES
 *       The driver frees an allocation behind the shim's back (its context destroyed through the
 *       real library, which the shim does not see), then hands the address out again: the new
 *       allocation's record replaces the stale one and the stale charge is given back. Reports
 *       whether the address came back (same=), and the shim's and the driver's usage.
 *
 * "The driver itself" is the real library behind the shim (libcuda-real.so.1, which the shim
 * loads), or the one library when run without the shim.
 */
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include "simgpu_test.h"

#define MiB (1ULL << 20)
#define SLOTS 48
#define RECENT 8
#define MAX_THREADS 64

#define CHECK(call)                                                                               \
    do {                                                                                          \
        CUresult rc_ = (call);                                                                    \
        if (rc_ != CUDA_SUCCESS) {                                                                \
            fprintf(stderr, "%s:%d: %s = %d\n", __FILE__, __LINE__, #call, (int)rc_);             \
            exit(3);                                                                              \
        }                                                                                         \
    } while (0)

static struct {
    __typeof__(&cuInit) init;
    __typeof__(&cuDevicePrimaryCtxRetain) retain;
    __typeof__(&cuCtxSetCurrent) set_current;
    __typeof__(&cuCtxCreate_v2) ctx_create;
    __typeof__(&cuMemAlloc_v2) alloc;
    __typeof__(&cuMemFree_v2) free;
    __typeof__(&cuMemGetInfo_v2) info;
    __typeof__(&cuMemGetInfo_v2) driver_info; /* the real driver's, past the shim */
    __typeof__(&cuMemCreate) create;
    __typeof__(&cuMemRelease) release;
    __typeof__(&cuMemAddressReserve) reserve;
    __typeof__(&cuMemMap) map;
    __typeof__(&cuMemUnmap) unmap;
    __typeof__(&cuMemGetAllocationGranularity) granularity;
    __typeof__(&cuMemAllocAsync) alloc_async;
    __typeof__(&cuMemFreeAsync) free_async;
    __typeof__(&cuDeviceGetMemPool) get_pool;
    __typeof__(&cuMemPoolTrimTo) trim;
    __typeof__(&cuCtxSynchronize) sync;
} cu;

static CUcontext primary, other;
static size_t granule = 2 * MiB;

static void load(void)
{
    void *lib = test_open("TEST_LIBCUDA", "libcuda.so.1");
    cu.init = (__typeof__(cu.init))test_sym(lib, "cuInit");
    cu.retain = (__typeof__(cu.retain))test_sym(lib, "cuDevicePrimaryCtxRetain");
    cu.set_current = (__typeof__(cu.set_current))test_sym(lib, "cuCtxSetCurrent");
    cu.ctx_create = (__typeof__(cu.ctx_create))test_sym(lib, "cuCtxCreate_v2");
    cu.alloc = (__typeof__(cu.alloc))test_sym(lib, "cuMemAlloc_v2");
    cu.free = (__typeof__(cu.free))test_sym(lib, "cuMemFree_v2");
    cu.info = (__typeof__(cu.info))test_sym(lib, "cuMemGetInfo_v2");
    cu.create = (__typeof__(cu.create))test_sym(lib, "cuMemCreate");
    cu.release = (__typeof__(cu.release))test_sym(lib, "cuMemRelease");
    cu.reserve = (__typeof__(cu.reserve))test_sym(lib, "cuMemAddressReserve");
    cu.map = (__typeof__(cu.map))test_sym(lib, "cuMemMap");
    cu.unmap = (__typeof__(cu.unmap))test_sym(lib, "cuMemUnmap");
    cu.granularity =
        (__typeof__(cu.granularity))test_sym(lib, "cuMemGetAllocationGranularity");
    cu.alloc_async = (__typeof__(cu.alloc_async))test_sym(lib, "cuMemAllocAsync");
    cu.free_async = (__typeof__(cu.free_async))test_sym(lib, "cuMemFreeAsync");
    cu.get_pool = (__typeof__(cu.get_pool))test_sym(lib, "cuDeviceGetMemPool");
    cu.trim = (__typeof__(cu.trim))test_sym(lib, "cuMemPoolTrimTo");
    cu.sync = (__typeof__(cu.sync))test_sym(lib, "cuCtxSynchronize");
    void *real = dlopen("libcuda-real.so.1", RTLD_NOW | RTLD_NOLOAD);
    cu.driver_info = (__typeof__(cu.info))test_sym(real != NULL ? real : lib, "cuMemGetInfo_v2");
}

static void setup(void)
{
    CHECK(cu.init(0));
    CHECK(cu.retain(&primary, 0));
    CHECK(cu.ctx_create(&other, 0, 0));
    CHECK(cu.set_current(primary));
    CUmemAllocationProp prop = {.type = CU_MEM_ALLOCATION_TYPE_PINNED,
                                .location = {.type = CU_MEM_LOCATION_TYPE_DEVICE, .id = 0}};
    size_t g = 0;
    if (cu.granularity(&g, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM) == CUDA_SUCCESS && g > 0)
        granule = g > 2 * MiB ? g : 2 * MiB;
}

/* The claim's usage as the shim shows it, and the GPU's as the driver shows it. */
static void usage(uint64_t *shim_used, uint64_t *driver_used, uint64_t *limit)
{
    size_t f = 0, t = 0;
    CHECK(cu.info(&f, &t));
    *shim_used = t - f;
    if (limit != NULL)
        *limit = t;
    CHECK(cu.driver_info(&f, &t));
    *driver_used = t - f;
}

/* Allocate the whole limit in one piece (and free it): the answer. */
static int full_limit(uint64_t limit)
{
    CUdeviceptr p = 0;
    CUresult rc = cu.alloc(&p, limit);
    if (rc == CUDA_SUCCESS)
        CHECK(cu.free(p));
    return (int)rc;
}

/* ------------------------------------------------------------------ double free -------- */

static pthread_barrier_t df_start, df_done;
static CUdeviceptr df_ptr;
static atomic_int df_freed;
static int df_rounds;

static void *df_thread(void *arg)
{
    (void)arg;
    CHECK(cu.set_current(primary));
    for (int r = 0; r < df_rounds; r++) {
        pthread_barrier_wait(&df_start);
        if (cu.free(df_ptr) == CUDA_SUCCESS)
            atomic_fetch_add(&df_freed, 1);
        pthread_barrier_wait(&df_done);
    }
    return NULL;
}

static int double_free(int threads, size_t bytes, int rounds)
{
    if (threads < 1 || threads > MAX_THREADS)
        return 2;
    pthread_barrier_init(&df_start, NULL, (unsigned)threads + 1);
    pthread_barrier_init(&df_done, NULL, (unsigned)threads + 1);
    df_rounds = rounds;
    pthread_t t[MAX_THREADS];
    for (int i = 0; i < threads; i++)
        pthread_create(&t[i], NULL, df_thread, NULL);
    int wrong = 0;
    for (int r = 0; r < rounds; r++) {
        atomic_store(&df_freed, 0);
        CHECK(cu.alloc(&df_ptr, bytes));
        pthread_barrier_wait(&df_start);
        pthread_barrier_wait(&df_done);
        if (atomic_load(&df_freed) != 1)
            wrong++;
    }
    for (int i = 0; i < threads; i++)
        pthread_join(t[i], NULL);
    uint64_t s = 0, d = 0, limit = 0;
    usage(&s, &d, &limit);
    printf("rounds=%d rounds_not_freed_once=%d shim=%llu driver=%llu limit=%llu\n", rounds, wrong,
           (unsigned long long)s, (unsigned long long)d, (unsigned long long)limit);
    printf("full_rc=%d\n", full_limit(limit));
    return 0;
}

/* ------------------------------------------------------------------ stress ------------- */

/* Shared by the processes (an anonymous shared mapping made before they fork). */
struct shared {
    pthread_barrier_t barrier; /* every thread of every process */
    atomic_int mismatches;
    atomic_ullong ops;
};

static struct shared *sh;
static int ops_per_round, rounds, nthreads;
static uint64_t seed;
static int proc_index;
static _Atomic CUdeviceptr slots[SLOTS];
static _Atomic CUdeviceptr async_slots[SLOTS]; /* stream-ordered allocations */
static CUdeviceptr *allocated; /* every pointer the driver handed out, to free at the end */
static atomic_size_t nallocated;
static size_t max_allocated;

struct vmm {
    CUmemGenericAllocationHandle handle;
    CUdeviceptr va;
    size_t size;
    bool mapped;
};

static uint64_t next(uint64_t *s)
{
    uint64_t x = *s += 0x9e3779b97f4a7c15ULL;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
    return x ^ (x >> 31);
}

static void vmm_step(struct vmm *v, uint64_t r)
{
    CUmemAllocationProp prop = {.type = CU_MEM_ALLOCATION_TYPE_PINNED,
                                .location = {.type = CU_MEM_LOCATION_TYPE_DEVICE, .id = 0}};
    if (v->handle == 0 && !v->mapped) {
        v->size = granule * (1 + r % 2);
        if (cu.create(&v->handle, v->size, &prop, 0) != CUDA_SUCCESS) {
            v->handle = 0;
            return;
        }
        if (v->va == 0)
            CHECK(cu.reserve(&v->va, 4 * granule, 0, 0, 0));
        if (r & 8)
            return; /* released unmapped next time */
        if (cu.map(v->va, v->size, 0, v->handle, 0) == CUDA_SUCCESS)
            v->mapped = true;
        return;
    }
    if (v->handle != 0) {
        cu.release(v->handle);
        if (r & 16)
            cu.release(v->handle); /* a double release */
        v->handle = 0;
        return;
    }
    cu.unmap(v->va, v->size);
    if (r & 16)
        cu.unmap(v->va, v->size); /* a double unmap */
    v->mapped = false;
}

static void op(uint64_t *rs, CUdeviceptr *recent, int *nrecent, struct vmm *v)
{
    uint64_t r = next(rs);
    _Atomic CUdeviceptr *slot = &slots[(r >> 8) % SLOTS];
    unsigned kind = (unsigned)(r % 100);
    if (kind < 40) { /* allocate into a slot; what it held is freed */
        CUdeviceptr p = 0;
        if (cu.alloc(&p, (size_t)MiB * (1 + (r >> 20) % 8)) != CUDA_SUCCESS)
            return;
        size_t at = atomic_fetch_add(&nallocated, 1);
        if (at < max_allocated)
            allocated[at] = p;
        CUdeviceptr old = atomic_exchange(slot, p);
        if (old != 0)
            cu.free(old);
    } else if (kind < 62) { /* free a slot's pointer, which another thread may free too */
        CUdeviceptr p = atomic_load(slot);
        if (p == 0 || cu.free(p) != CUDA_SUCCESS)
            return;
        atomic_compare_exchange_strong(slot, &p, 0);
        recent[(*nrecent)++ % RECENT] = p;
    } else if (kind < 70) { /* free twice in a row */
        CUdeviceptr p = atomic_load(slot);
        if (p != 0 && cu.free(p) == CUDA_SUCCESS)
            atomic_compare_exchange_strong(slot, &p, 0);
        if (p != 0)
            cu.free(p);
    } else if (kind < 78) { /* free a pointer freed before: maybe someone's new allocation */
        if (*nrecent > 0)
            cu.free(recent[(r >> 12) % (*nrecent < RECENT ? (unsigned)*nrecent : RECENT)]);
    } else if (kind < 84) { /* free pointers that were never allocated */
        CUdeviceptr p = atomic_load(slot);
        cu.free(p != 0 ? p + 4096 : (CUdeviceptr)0x10000);
    } else if (kind < 88) { /* stream-ordered: allocate into a slot, or free one (maybe twice) */
        _Atomic CUdeviceptr *aslot = &async_slots[(r >> 8) % SLOTS];
        if (r & (1u << 30)) {
            CUdeviceptr p = 0;
            if (cu.alloc_async(&p, (size_t)MiB * (1 + (r >> 20) % 4), NULL) != CUDA_SUCCESS)
                return;
            CUdeviceptr old = atomic_exchange(aslot, p);
            if (old != 0)
                cu.free_async(old, NULL);
        } else {
            CUdeviceptr p = atomic_load(aslot);
            if (p != 0 && cu.free_async(p, NULL) == CUDA_SUCCESS)
                atomic_compare_exchange_strong(aslot, &p, 0);
            if (p != 0 && (r & (1u << 31)))
                cu.free_async(p, NULL);
        }
    } else if (kind < 92) { /* free from another context */
        CUdeviceptr p = atomic_load(slot);
        CHECK(cu.set_current(other));
        if (p != 0 && cu.free(p) == CUDA_SUCCESS)
            atomic_compare_exchange_strong(slot, &p, 0);
        CHECK(cu.set_current(primary));
    } else {
        vmm_step(v, r >> 16);
    }
}

/* All threads of all processes call it; the first thread of the first process reports. */
static void quiescent(int thread, const char *label)
{
    pthread_barrier_wait(&sh->barrier);
    if (proc_index == 0 && thread == 0) {
        static uint64_t baseline;
        static bool have_baseline;
        uint64_t s = 0, d = 0;
        usage(&s, &d, NULL);
        if (!have_baseline) {
            baseline = d;
            have_baseline = true;
        }
        d -= baseline;
        if (s != d)
            atomic_fetch_add(&sh->mismatches, 1);
        printf("%s shim=%llu driver=%llu\n", label, (unsigned long long)s,
               (unsigned long long)d);
        fflush(stdout);
    }
    pthread_barrier_wait(&sh->barrier);
}

struct worker {
    int index;
    pthread_t thread;
};

static void *stress_thread(void *arg)
{
    const struct worker *w = arg;
    CHECK(cu.set_current(primary));
    uint64_t rs = seed ^ ((uint64_t)proc_index << 40) ^ ((uint64_t)w->index << 20);
    CUdeviceptr recent[RECENT];
    int nrecent = 0;
    struct vmm v = {0};
    quiescent(w->index, "start");
    for (int round = 0; round < rounds; round++) {
        for (int i = 0; i < ops_per_round; i++)
            op(&rs, recent, &nrecent, &v);
        atomic_fetch_add(&sh->ops, (unsigned long long)ops_per_round);
        char label[32];
        snprintf(label, sizeof label, "round=%d", round);
        quiescent(w->index, label);
    }
    if (v.mapped)
        cu.unmap(v.va, v.size);
    if (v.handle != 0)
        cu.release(v.handle);
    pthread_barrier_wait(&sh->barrier);
    if (w->index == 0) { /* whatever is still allocated, whoever's it is */
        size_t n = atomic_load(&nallocated);
        for (size_t i = 0; i < n && i < max_allocated; i++)
            cu.free(allocated[i]);
        for (int i = 0; i < SLOTS; i++)
            if (async_slots[i] != 0)
                cu.free_async(async_slots[i], NULL);
        CUmemoryPool pool = NULL; /* what the pool caches goes back to the device */
        CHECK(cu.sync());
        CHECK(cu.get_pool(&pool, 0));
        CHECK(cu.trim(pool, 0));
    }
    quiescent(w->index, "end");
    return NULL;
}

static void stress_process(int index)
{
    proc_index = index;
    setup();
    struct worker w[MAX_THREADS];
    for (int i = 0; i < nthreads; i++) {
        w[i].index = i;
        pthread_create(&w[i].thread, NULL, stress_thread, &w[i]);
    }
    for (int i = 0; i < nthreads; i++)
        pthread_join(w[i].thread, NULL);
}

static int stress(int procs, int threads, int nrounds, int ops, uint64_t s)
{
    if (procs < 1 || threads < 1 || threads > MAX_THREADS)
        return 2;
    nthreads = threads;
    rounds = nrounds;
    ops_per_round = ops;
    seed = s;
    sh = mmap(NULL, sizeof *sh, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    if (sh == MAP_FAILED)
        return 2;
    pthread_barrierattr_t attr;
    pthread_barrierattr_init(&attr);
    pthread_barrierattr_setpshared(&attr, PTHREAD_PROCESS_SHARED);
    /* The per-round barrier counts the threads of every process; the set-up one reuses it. */
    pthread_barrier_init(&sh->barrier, &attr, (unsigned)(procs * threads));
    max_allocated = (size_t)threads * (size_t)nrounds * (size_t)ops;
    allocated = calloc(max_allocated, sizeof *allocated);
    if (allocated == NULL)
        return 2;
    fflush(stdout);
    pid_t children[64];
    int nchildren = 0;
    for (int i = 1; i < procs && nchildren < 64; i++) {
        pid_t pid = fork();
        if (pid == 0) {
            stress_process(i);
            _exit(0);
        }
        children[nchildren++] = pid;
    }
    stress_process(0);
    int failed = 0;
    for (int i = 0; i < nchildren; i++) {
        int status = 0;
        waitpid(children[i], &status, 0);
        if (!WIFEXITED(status) || WEXITSTATUS(status) != 0)
            failed++;
    }
    uint64_t sused = 0, dused = 0, limit = 0;
    usage(&sused, &dused, &limit);
    printf("ops=%llu mismatches=%d children_failed=%d\n", (unsigned long long)atomic_load(&sh->ops),
           atomic_load(&sh->mismatches), failed);
    printf("full_rc=%d\n", full_limit(limit));
    return 0;
}

/* ------------------------------------------------------------------ unseen free -------- */

static int unseen(size_t bytes)
{
    setup();
    void *real = dlopen("libcuda-real.so.1", RTLD_NOW | RTLD_NOLOAD);
    if (real == NULL) {
        fprintf(stderr, "needs the shim (libcuda-real.so.1)\n");
        return 2;
    }
    __typeof__(&cuCtxDestroy_v2) destroy_unseen =
        (__typeof__(&cuCtxDestroy_v2))test_sym(real, "cuCtxDestroy_v2");
    uint64_t base_s = 0, base_d = 0;
    usage(&base_s, &base_d, NULL);
    CHECK(cu.set_current(other));
    CUdeviceptr gone = 0;
    CHECK(cu.alloc(&gone, bytes));
    CHECK(cu.set_current(primary));
    CHECK(destroy_unseen(other)); /* the driver frees `gone`; the shim still charges it */
    uint64_t s = 0, d = 0;
    usage(&s, &d, NULL);
    printf("before shim=%llu driver=%llu\n", (unsigned long long)(s - base_s),
           (unsigned long long)(d - base_d));
    CUdeviceptr again = 0;
    CHECK(cu.alloc(&again, bytes));
    usage(&s, &d, NULL);
    printf("same=%d after shim=%llu driver=%llu\n", again == gone,
           (unsigned long long)(s - base_s), (unsigned long long)(d - base_d));
    CHECK(cu.free(again));
    usage(&s, &d, NULL);
    printf("freed shim=%llu driver=%llu\n", (unsigned long long)(s - base_s),
           (unsigned long long)(d - base_d));
    return 0;
}

int main(int argc, char **argv)
{
    if (argc < 2) {
        fprintf(stderr, "usage: see the comment at the top of shim_stress.c\n");
        return 2;
    }
    load();
    if (strcmp(argv[1], "doublefree") == 0 && argc == 5) {
        setup();
        return double_free(atoi(argv[2]), strtoull(argv[3], NULL, 0), atoi(argv[4]));
    }
    if (strcmp(argv[1], "unseen") == 0 && argc == 3)
        return unseen(strtoull(argv[2], NULL, 0));
    if (strcmp(argv[1], "stress") == 0 && argc == 7)
        return stress(atoi(argv[2]), atoi(argv[3]), atoi(argv[4]), atoi(argv[5]),
                      strtoull(argv[6], NULL, 0));
    fprintf(stderr, "unknown mode or wrong arguments\n");
    return 2;
}
