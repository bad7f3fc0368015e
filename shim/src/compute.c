/*
 * Compute controller.
 *
 * Goal: over any stretch of time longer than a few kernels, the GPU time taken by the claim's
 * kernels on a GPU is `cores` percent of wall time, whatever the kernel durations and however
 * many processes of the claim launch.
 *
 * Design - a GPU-time budget shared by the claim, charged with measured durations:
 *
 *  - Budget. Each capped GPU has a budget in nanoseconds of GPU time in the usage region, shared
 *    by all the claim's processes. It is credited continuously at cores/100 ns per ns of wall
 *    time (lock-free: whoever advances `refill_ns` by compare-and-swap credits the interval) and
 *    capped at BURST_NS, so idleness does not bank more than a short burst.
 *  - Gate. A launch proceeds when the budget is not negative; otherwise the launching thread
 *    sleeps exactly as long as the debt takes to repay at the capped rate and looks again. A sleep
 *    that overshoots costs nothing: the time slept is credited, not lost (up to the burst).
 *  - Charge. Each launch is charged its expected GPU time when it passes the gate. Expectation
 *    is per launch shape (function, grid, block, shared memory; graphs by executable graph): the
 *    minimum over the last WINDOW measured durations. Measured durations include time spent
 *    queued behind other processes' kernels (events bracket the stream, not the GPU), which only
 *    ever inflates them; the windowed minimum discards that inflation while still following a
 *    kernel that really becomes slower within WINDOW samples.
 *  - Measurement. Events are recorded around every launch of a shape until it has WARMUP
 *    samples, then around one launch in SAMPLE_EVERY. Completed measurements are collected
 *    without blocking on later launches; the first launch of a new shape waits for its own
 *    measurement before the next launch of that shape, so no burst of unknown-cost launches
 *    slips through. When a measurement lowers or raises the estimate of a launch that was
 *    charged differently, the difference is settled with the budget.
 *  - Nothing of this runs when no GPU of the claim is capped: the launch hooks test one flag
 *    and call through.
 */
#include <pthread.h>
#include <string.h>
#include <time.h>

#include "compute.h"
#include "log.h"

#define BURST_NS 10000000LL      /* 10 ms of GPU time */
#define MAX_SLEEP_NS 50000000ULL /* look again at least every 50 ms */
#define WINDOW 32
#define WARMUP 8
#define SAMPLE_EVERY 4
#define SHAPES 512 /* estimate cache entries (direct-mapped) */
#define PENDING 64
#define EVENT_POOL 128

struct shape {
    uint64_t key; /* 0: empty */
    uint64_t launches;
    uint32_t samples; /* total measured */
    uint32_t pending; /* measurements in flight */
    int64_t window[WINDOW];
    int64_t estimate; /* -1: unknown */
};

struct pending {
    CUevent start, end;
    CUcontext ctx;
    uint64_t key;
    int gpu;
    int64_t charged;
};

struct pooled_event {
    CUevent ev;
    CUcontext ctx;
};

static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static struct shape shapes[SHAPES];
static struct pending pending[PENDING];
static int pending_head, pending_count;
static struct pooled_event pool[EVENT_POOL];
static int pool_count;

uint64_t shim_launch_key(const void *fn, unsigned gx, unsigned gy, unsigned gz, unsigned bx,
                         unsigned by, unsigned bz, unsigned shared)
{
    uint64_t h = (uint64_t)(uintptr_t)fn * 0x9e3779b97f4a7c15ULL;
    uint64_t parts[7] = {gx, gy, gz, bx, by, bz, shared};
    for (int i = 0; i < 7; i++)
        h = (h ^ parts[i]) * 0x100000001b3ULL;
    return h | 1; /* never 0 */
}

static void sleep_ns(uint64_t ns)
{
    struct timespec ts = {(time_t)(ns / 1000000000ULL), (long)(ns % 1000000000ULL)};
    while (nanosleep(&ts, &ts) != 0)
        ;
}

/* ---------------------------------------------------------------- shared budget --------- */

static void refill(struct tessera_region_gpu *g, uint32_t cores)
{
    uint64_t now = tessera_now_ns();
    uint64_t last = __atomic_load_n(&g->refill_ns, __ATOMIC_ACQUIRE);
    if (now <= last)
        return;
    if (!__atomic_compare_exchange_n(&g->refill_ns, &last, now, false, __ATOMIC_ACQ_REL,
                                     __ATOMIC_ACQUIRE))
        return; /* another thread credited this interval */
    uint64_t span = now - last;
    int64_t credit = span > (uint64_t)BURST_NS * 100 ? BURST_NS * 100 / (int64_t)cores
                                                     : (int64_t)(span * cores / 100);
    int64_t b = __atomic_add_fetch(&g->budget_ns, credit, __ATOMIC_ACQ_REL);
    while (b > BURST_NS &&
           !__atomic_compare_exchange_n(&g->budget_ns, &b, BURST_NS, false, __ATOMIC_ACQ_REL,
                                        __ATOMIC_ACQUIRE))
        ;
}

static void gate(struct tessera_region_gpu *g, uint32_t cores)
{
    uint64_t waited = 0;
    for (;;) {
        refill(g, cores);
        int64_t b = __atomic_load_n(&g->budget_ns, __ATOMIC_ACQUIRE);
        if (b >= 0)
            break;
        uint64_t wait = (uint64_t)(-b) * 100 / cores;
        if (wait > MAX_SLEEP_NS)
            wait = MAX_SLEEP_NS;
        uint64_t t0 = tessera_now_ns();
        sleep_ns(wait);
        waited += tessera_now_ns() - t0;
    }
    if (waited > 0)
        __atomic_add_fetch(&g->throttled_ns, waited, __ATOMIC_RELAXED);
}

static void charge(int gpu, int64_t ns)
{
    if (ns == 0)
        return;
    struct tessera_region_gpu *g = &shim.region.map->gpus[gpu];
    __atomic_sub_fetch(&g->budget_ns, ns, __ATOMIC_ACQ_REL);
    if (ns > 0)
        __atomic_add_fetch(&g->charged_ns, (uint64_t)ns, __ATOMIC_RELAXED);
}

/* ---------------------------------------------------------------- estimates ------------- */

static struct shape *shape_of(uint64_t key)
{
    struct shape *s = &shapes[(key >> 7) % SHAPES];
    if (s->key != key) {
        memset(s, 0, sizeof *s);
        s->key = key;
        s->estimate = -1;
    }
    return s;
}

static void add_sample(struct shape *s, int64_t ns)
{
    s->window[s->samples % WINDOW] = ns;
    s->samples++;
    uint32_t n = s->samples < WINDOW ? s->samples : WINDOW;
    int64_t m = s->window[0];
    for (uint32_t i = 1; i < n; i++)
        if (s->window[i] < m)
            m = s->window[i];
    s->estimate = m;
}

/* ---------------------------------------------------------------- events ---------------- */

static CUevent take_event(CUcontext ctx)
{
    for (int i = pool_count - 1; i >= 0; i--) {
        if (pool[i].ctx == ctx) {
            CUevent ev = pool[i].ev;
            pool[i] = pool[--pool_count];
            return ev;
        }
    }
    CUevent ev = NULL;
    if (shim_real.cuEventCreate(&ev, CU_EVENT_DEFAULT) != CUDA_SUCCESS)
        return NULL;
    return ev;
}

static void give_event(CUevent ev, CUcontext ctx)
{
    if (ev == NULL)
        return;
    if (pool_count < EVENT_POOL)
        pool[pool_count++] = (struct pooled_event){ev, ctx};
    else
        shim_real.cuEventDestroy_v2(ev);
}

/* Settle one finished measurement. */
static void settle(struct pending *p, float ms)
{
    struct shape *s = shape_of(p->key);
    if (s->pending > 0)
        s->pending--;
    int64_t ns = (int64_t)((double)ms * 1e6);
    if (ns < 0)
        ns = 0;
    add_sample(s, ns);
    /* The launch was charged its expectation at the time; charge the difference to what we now
     * expect such a launch to take (never more than it measured). */
    int64_t truth = s->estimate < ns ? s->estimate : ns;
    charge(p->gpu, truth - p->charged);
}

/* Collect finished measurements, oldest first. With `block_key`, wait (polling) until a
 * measurement of that shape has settled. Called with `mu` held. */
static void collect(uint64_t block_key)
{
    while (pending_count > 0) {
        struct pending *p = &pending[pending_head];
        CUresult q = shim_real.cuEventQuery(p->end);
        if (q == CUDA_ERROR_NOT_READY) {
            if (block_key == 0)
                return;
            sleep_ns(20000);
            continue;
        }
        float ms = 0;
        if (q == CUDA_SUCCESS &&
            shim_real.cuEventElapsedTime(&ms, p->start, p->end) == CUDA_SUCCESS) {
            settle(p, ms);
        } else {
            struct shape *s = shape_of(p->key); /* its context is gone: drop it */
            if (s->pending > 0)
                s->pending--;
        }
        give_event(p->start, p->ctx);
        give_event(p->end, p->ctx);
        pending_head = (pending_head + 1) % PENDING;
        pending_count--;
        if (block_key != 0 && shape_of(block_key)->estimate >= 0)
            block_key = 0;
    }
}

/* ---------------------------------------------------------------- launches -------------- */

void shim_compute_begin(struct shim_launch *l, uint64_t key, CUstream stream, bool ptsz)
{
    (void)ptsz;
    l->active = false;
    l->measure = false;
    if (!shim_devices_ready())
        return;
    int dev = -1;
    CUcontext ctx = NULL;
    if (!shim_current_device(&dev, &ctx))
        return;
    const struct shim_device *d = shim_device(dev);
    if (d == NULL || d->cores == 0)
        return;
    if (shim_real.cuStreamIsCapturing != NULL) {
        CUstreamCaptureStatus st = CU_STREAM_CAPTURE_STATUS_NONE;
        if (shim_real.cuStreamIsCapturing(stream, &st) == CUDA_SUCCESS &&
            st != CU_STREAM_CAPTURE_STATUS_NONE)
            return; /* recorded into a graph, not run: charged when the graph launches */
    }
    l->active = true;
    l->gpu = d->gpu;
    l->key = key;
    l->ctx = ctx;
    l->stream = stream;

    pthread_mutex_lock(&mu);
    struct shape *s = shape_of(key);
    collect(s->estimate < 0 && s->pending > 0 ? key : 0);
    s = shape_of(key);
    int64_t expect = s->estimate >= 0 ? s->estimate : 0;
    l->measure = s->samples + s->pending < WARMUP || s->launches % SAMPLE_EVERY == 0;
    s->launches++;
    if (l->measure && pending_count == PENDING)
        l->measure = false;
    if (l->measure) {
        l->start = take_event(ctx);
        l->end = take_event(ctx);
        if (l->start == NULL || l->end == NULL) {
            give_event(l->start, ctx);
            give_event(l->end, ctx);
            l->measure = false;
        } else {
            s->pending++;
        }
    }
    pthread_mutex_unlock(&mu);

    struct tessera_region_gpu *g = &shim.region.map->gpus[l->gpu];
    gate(g, d->cores);
    charge(l->gpu, expect);
    __atomic_add_fetch(&g->launches, 1, __ATOMIC_RELAXED);
    l->charged_ns = expect;
    if (l->measure && shim_real.cuEventRecord(l->start, stream) != CUDA_SUCCESS) {
        pthread_mutex_lock(&mu);
        shape_of(key)->pending--;
        give_event(l->start, ctx);
        give_event(l->end, ctx);
        pthread_mutex_unlock(&mu);
        l->measure = false;
    }
}

void shim_compute_end(struct shim_launch *l, CUresult rc)
{
    if (!l->active)
        return;
    if (rc != CUDA_SUCCESS)
        charge(l->gpu, -l->charged_ns); /* it never ran */
    if (!l->measure)
        return;
    bool recorded = rc == CUDA_SUCCESS && shim_real.cuEventRecord(l->end, l->stream) == CUDA_SUCCESS;
    pthread_mutex_lock(&mu);
    if (recorded && pending_count < PENDING) {
        pending[(pending_head + pending_count) % PENDING] = (struct pending){
            .start = l->start, .end = l->end, .ctx = l->ctx, .key = l->key, .gpu = l->gpu,
            .charged = l->charged_ns};
        pending_count++;
    } else {
        struct shape *s = shape_of(l->key);
        if (s->pending > 0)
            s->pending--;
        give_event(l->start, l->ctx);
        give_event(l->end, l->ctx);
    }
    pthread_mutex_unlock(&mu);
}

void shim_compute_prepare_fork(void)
{
    pthread_mutex_lock(&mu);
}

void shim_compute_parent_after_fork(void)
{
    pthread_mutex_unlock(&mu);
}

void shim_compute_child_after_fork(void)
{
    /* The parent's events and measurements are not the child's. */
    pthread_mutex_t fresh = PTHREAD_MUTEX_INITIALIZER;
    mu = fresh;
    memset(shapes, 0, sizeof shapes);
    pending_head = pending_count = pool_count = 0;
}
