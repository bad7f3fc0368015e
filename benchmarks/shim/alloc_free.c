/*
 * What the shim adds to a cuMemAlloc_v2 + cuMemFree_v2 pair with 10 000 allocations live,
 * measured inside one process: rounds of BATCH allocations and their frees through the library
 * the process loaded (the shim, when preloaded) alternate with the same rounds through the
 * driver's own functions (libcuda-real.so.1, which the shim loads), so both see the same load,
 * the same driver state and caches the driver's own work leaves behind. Across processes the
 * simulated driver's calls (microseconds) swing by more than the shim adds. Without the shim
 * both rounds call the driver: what the method reads then is its noise.
 *
 *     alloc_free ROUNDS [EVICT_KIB]
 *
 * EVICT_KIB: before every call (through either library) read EVICT_KIB KiB of other memory, one
 * load per cache line, as a driver whose own work is that large does (the simulator walks its
 * list of allocations): the shim's lines are then cold on every call, and what each costs shows
 * on a driver whose calls are otherwise empty (the stub). The reads are timed on both sides.
 *
 * A third kind of round calibrates what a cold line costs at the time of the run: the driver's
 * own functions, each call then reading a line of this program's own (as the shim reads its
 * state) and CHASE_LINES more, each line's address read from the one before (as the shim walks
 * its pointer table), on distinct cache sets, in an order no stride prefetcher follows. The
 * driver's work evicts them as it does the shim's lines, so that pair pays about as many cold
 * lines as the shim's (cache_lines.py counts those) at what a miss costs on this machine at that
 * moment, which varies from hour to hour with what else shares its caches: the shim's figure is
 * read against it. The three kinds of round take turns going first.
 *
 * Prints alloc_ns, free_ns (through the loaded library), direct_alloc_ns, direct_free_ns
 * (medians over the rounds), added_ns: the median over rounds of the loaded library's alloc +
 * free less the driver's own, ns per pair; and cold_lines_ns, the median over rounds of the
 * calibration's pair less the driver's own, for cold_lines (2 + 2 * CHASE_LINES) lines per pair.
 */
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "simgpu_test.h"

enum { LIVE = 10000, BATCH = 200, SIZE = 4096 };

#define CHECK(call)                                                                               \
    do {                                                                                          \
        CUresult rc_ = (call);                                                                    \
        if (rc_ != CUDA_SUCCESS) {                                                                \
            fprintf(stderr, "%s:%d: %s = %d\n", __FILE__, __LINE__, #call, (int)rc_);             \
            exit(3);                                                                              \
        }                                                                                         \
    } while (0)

struct api {
    __typeof__(&cuMemAlloc_v2) alloc;
    __typeof__(&cuMemFree_v2) free;
};

static volatile const unsigned char *evict_buf; /* NULL: no eviction */
static size_t evict_bytes;

/* Read every cache line of the eviction buffer (pushes the caller's lines out). */
static void evict(void)
{
    unsigned sum = 0;
    for (size_t i = 0; i < evict_bytes; i += 64)
        sum += evict_buf[i];
    __asm__ volatile("" : : "r"(sum));
}

enum { CHASE_LINES = 5, CHASE_STRIDE = 4096 + 64 };

/* What the calibration's calls read first, on a line of its own (read by each call, as the shim
 * reads its state): then CHASE_LINES lines CHASE_STRIDE apart (a distinct cache set each), in
 * chase_order, the first CHASE_LINES after each allocation and the rest after each free. */
static struct {
    struct api through; /* the driver's own functions */
    void *start[2];
} chase_state __attribute__((aligned(64)));
static const int chase_order[2 * CHASE_LINES] = {0, 7, 3, 5, 1, 8, 4, 9, 2, 6};

static void chase_init(const struct api *through)
{
    unsigned char *lines = aligned_alloc(4096, 2 * CHASE_LINES * CHASE_STRIDE);
    if (lines == NULL)
        exit(3);
    for (int i = 0; i < 2 * CHASE_LINES; i++) {
        void **line = (void **)(lines + chase_order[i] * CHASE_STRIDE);
        bool last = i % CHASE_LINES == CHASE_LINES - 1;
        *line = last ? NULL : lines + chase_order[i + 1] * CHASE_STRIDE;
    }
    chase_state.through = *through;
    chase_state.start[0] = lines + chase_order[0] * CHASE_STRIDE;
    chase_state.start[1] = lines + chase_order[CHASE_LINES] * CHASE_STRIDE;
}

/* Read a chain of lines, each load waiting for the one before (volatile: none is left out). */
static void chase(void *line)
{
    while (line != NULL)
        line = *(void *volatile *)line;
}

static CUresult chased_alloc(CUdeviceptr *dptr, size_t bytesize)
{
    CUresult rc = chase_state.through.alloc(dptr, bytesize);
    chase(chase_state.start[0]);
    return rc;
}

static CUresult chased_free(CUdeviceptr dptr)
{
    CUresult rc = chase_state.through.free(dptr);
    chase(chase_state.start[1]);
    return rc;
}

/* One round of BATCH allocations, then their frees: ns per call of each. */
static void round_of(const struct api *a, int64_t *alloc_ns, int64_t *free_ns)
{
    static CUdeviceptr batch[BATCH];
    uint64_t t0 = test_now_ns();
    for (int i = 0; i < BATCH; i++) {
        evict();
        CHECK(a->alloc(&batch[i], SIZE));
    }
    uint64_t t1 = test_now_ns();
    for (int i = 0; i < BATCH; i++) {
        evict();
        CHECK(a->free(batch[i]));
    }
    uint64_t t2 = test_now_ns();
    *alloc_ns = (int64_t)(t1 - t0) / BATCH;
    *free_ns = (int64_t)(t2 - t1) / BATCH;
}

static int by_value(const void *a, const void *b)
{
    int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
    return (x > y) - (x < y);
}

static int64_t median(int64_t *v, int n)
{
    qsort(v, (size_t)n, sizeof *v, by_value);
    return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

int main(int argc, char **argv)
{
    int rounds = argc > 1 ? atoi(argv[1]) : 100;
    long evict_kib = argc > 2 ? atol(argv[2]) : 0;
    if (rounds < 1 || rounds > 100000 || evict_kib < 0 || evict_kib > 65536) {
        fprintf(stderr, "usage: alloc_free ROUNDS (1 to 100000) [EVICT_KIB (0 to 65536)]\n");
        return 2;
    }
    evict_bytes = (size_t)evict_kib << 10;
    if (evict_bytes > 0) {
        unsigned char *b = malloc(evict_bytes);
        if (b == NULL)
            return 3;
        memset(b, 1, evict_bytes);
        evict_buf = b;
    }
    void *lib = test_open("TEST_LIBCUDA", "libcuda.so.1");
    void *real = dlopen("libcuda-real.so.1", RTLD_NOW | RTLD_NOLOAD);
    LOAD(lib, cuInit);
    LOAD(lib, cuDevicePrimaryCtxRetain);
    LOAD(lib, cuCtxSetCurrent);
    struct api loaded = {(__typeof__(&cuMemAlloc_v2))test_sym(lib, "cuMemAlloc_v2"),
                         (__typeof__(&cuMemFree_v2))test_sym(lib, "cuMemFree_v2")};
    struct api direct = loaded;
    if (real != NULL) {
        direct.alloc = (__typeof__(&cuMemAlloc_v2))test_sym(real, "cuMemAlloc_v2");
        direct.free = (__typeof__(&cuMemFree_v2))test_sym(real, "cuMemFree_v2");
    }
    CHECK(p_cuInit(0));
    CUcontext ctx = NULL;
    CHECK(p_cuDevicePrimaryCtxRetain(&ctx, 0));
    CHECK(p_cuCtxSetCurrent(ctx));
    static CUdeviceptr live[LIVE];
    for (int i = 0; i < LIVE; i++)
        CHECK(loaded.alloc(&live[i], 512));
    chase_init(&direct);
    const struct api chased = {chased_alloc, chased_free};
    int64_t *v = calloc(8 * (size_t)rounds, sizeof *v);
    if (v == NULL)
        return 3;
    int64_t *la = v, *lf = v + rounds, *da = v + 2 * rounds, *df = v + 3 * rounds;
    int64_t *ca = v + 4 * rounds, *cf = v + 5 * rounds;
    int64_t *added = v + 6 * rounds, *cold = v + 7 * rounds;
    for (int r = 0; r < rounds; r++) {
        /* Which goes first rotates too, so none always follows the same one's work. */
        struct {
            const struct api *api;
            int64_t *alloc_ns, *free_ns;
        } kinds[3] = {{&direct, &da[r], &df[r]}, {&loaded, &la[r], &lf[r]}, {&chased, &ca[r], &cf[r]}};
        for (int k = 0; k < 3; k++) {
            int which = (r + k) % 3;
            round_of(kinds[which].api, kinds[which].alloc_ns, kinds[which].free_ns);
        }
        added[r] = la[r] + lf[r] - da[r] - df[r];
        cold[r] = ca[r] + cf[r] - da[r] - df[r];
    }
    for (int i = 0; i < LIVE; i++)
        CHECK(loaded.free(live[i]));
    printf("alloc_ns=%lld free_ns=%lld direct_alloc_ns=%lld direct_free_ns=%lld added_ns=%lld "
           "cold_lines_ns=%lld cold_lines=%d\n",
           (long long)median(la, rounds), (long long)median(lf, rounds),
           (long long)median(da, rounds), (long long)median(df, rounds),
           (long long)median(added, rounds), (long long)median(cold, rounds), 2 * (1 + CHASE_LINES));
    free(v);
    return 0;
}
