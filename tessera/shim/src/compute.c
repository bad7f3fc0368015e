/*
 * Compute controller.
 *
 * Goal: over any stretch of time longer than a few kernels, the GPU time taken by the claim's
 * kernels on a GPU is `cores` percent of wall time, whatever the kernel durations and however
 * many processes of the claim launch.
 *
 * Design - a GPU-time budget shared by the claim, charged at launch, settled on completion:
 *
 *  - Budget. Each capped GPU has a budget in nanoseconds of GPU time in the usage region, shared
 *    by all the claim's processes. It is credited continuously at cores/100 ns per ns of wall
 *    time (lock-free: whoever advances `refill_ns` by compare-and-swap credits the interval) and
 *    capped at BURST_NS, so idleness does not bank more than a short burst.
 *  - Gate. A launch passes when the budget is not negative, and passing *is* the charge: one
 *    compare-and-swap takes the launch's expected duration from a non-negative budget. So of
 *    several processes woken at once only as many pass as the budget covers (no thundering
 *    herd that queues kernels behind each other). A thread that finds the budget negative
 *    sleeps exactly as long as the debt takes to repay at the capped rate and looks again; a
 *    sleep that overshoots costs nothing, the time slept is credited.
 *  - Charge at launch. Expected duration per launch shape (function, grid, block, shared
 *    memory; graphs by executable graph): the minimum over the last WINDOW measured durations.
 *    A shape never measured yet is charged the claim's latest settled estimate of any shape
 *    (`hint_ns` in the region) or, before any, BURST_NS - so the first launches of several
 *    processes are spaced out instead of all passing for free.
 *  - Settle on completion. Events bracket every launch of a shape until it has WARMUP samples,
 *    then one in SAMPLE_EVERY; measurements are collected without blocking (an event is queried
 *    only once its kernel can have finished). A measurement includes time spent queued behind
 *    other kernels (events bracket the stream, not the GPU), which only ever inflates it, so the
 *    windowed minimum is the best bound on the true duration. Each shape keeps a ledger of its
 *    last launches (up to HORIZON) and what they were charged in total; every new sample
 *    re-settles the whole ledger to `launches x estimate`, refunding or charging the difference.
 *    A launch charged a provisional or a queue-inflated figure is thus corrected as soon as a
 *    cleaner sample arrives, whether or not it was itself measured: what the claim pays does
 *    not depend on the estimate at launch time, only on the best estimate within HORIZON
 *    launches. Refunds may lift the budget above the burst: that is time the claim was owed.
 *  - Priority (priority.c). On a GPU with a priority board, a low-priority launch first holds
 *    back while a high-priority neighbour is busy, then goes through the gate as usual; a
 *    high-priority launch is estimated and measured like a capped one (charged only if capped)
 *    and publishes its expected end. An uncapped low-priority launch only holds back.
 *  - Cost. Per capped launch: one cuCtxGetCurrent, the launch, and on average well under one
 *    event call (sampling, queries only when due); cuStreamIsCapturing only in a process that
 *    has begun a stream capture (capture_hooks.c). With no GPU of the claim capped the launch
 *    hooks test one flag and call through.
 */
#include <pthread.h>
#include <string.h>
#include <time.h>

#include "capture.h"
#include "compute.h"
#include "log.h"
#include "priority.h"

#define BURST_NS 10000000LL      /* 10 ms of GPU time */
#define MAX_SLEEP_NS 50000000ULL /* look again at least every 50 ms */
#define WINDOW 32
#define WARMUP 8
#define SAMPLE_EVERY 16
#define HORIZON 256        /* launches a shape's ledger re-settles */
#define MIN_POLL_NS 10000  /* an unfinished measurement is queried again after at least this */
#define SHAPES 512         /* estimate cache entries (direct-mapped) */
#define PENDING 64
#define EVENT_POOL 128

struct shape {
    uint64_t key; /* 0: empty */
    uint64_t launches;
    uint32_t samples; /* total measured */
    uint32_t pending; /* measurements in flight */
    int64_t window[WINDOW];
    int64_t estimate; /* -1: unknown */
    /* The ledger: the last launches of this shape and what they have been charged in all. */
    uint32_t ledger_gen;
    uint32_t ledger_n;
    int64_t ledger_charged;
};

struct pending {
    CUevent start, end;
    CUcontext ctx;
    uint64_t key;
    uint64_t due_ns; /* not queried before this CLOCK_MONOTONIC time */
    int gpu;
    bool capped; /* settle the ledger (an uncapped high-priority launch only refines estimates) */
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
    /* Credit never lifts the budget past the burst (a refund, below, may: that time was owed). */
    int64_t b = __atomic_load_n(&g->budget_ns, __ATOMIC_ACQUIRE);
    for (;;) {
        int64_t nb = b + credit;
        if (nb > BURST_NS)
            nb = b > BURST_NS ? b : BURST_NS;
        if (__atomic_compare_exchange_n(&g->budget_ns, &b, nb, false, __ATOMIC_ACQ_REL,
                                        __ATOMIC_ACQUIRE))
            return;
    }
}

/* Wait until the budget is not negative, then take `ns` from it in the same atomic step. */
static void gate_and_charge(struct tessera_region_gpu *g, uint32_t cores, int64_t ns)
{
    uint64_t waited = 0;
    for (;;) {
        refill(g, cores);
        int64_t b = __atomic_load_n(&g->budget_ns, __ATOMIC_ACQUIRE);
        while (b >= 0) {
            if (__atomic_compare_exchange_n(&g->budget_ns, &b, b - ns, false, __ATOMIC_ACQ_REL,
                                            __ATOMIC_ACQUIRE))
                goto passed;
        }
        uint64_t wait = (uint64_t)(-b) * 100 / cores;
        if (wait > MAX_SLEEP_NS)
            wait = MAX_SLEEP_NS;
        uint64_t t0 = tessera_now_ns();
        sleep_ns(wait);
        waited += tessera_now_ns() - t0;
    }
passed:
    if (ns > 0)
        __atomic_add_fetch(&g->charged_ns, (uint64_t)ns, __ATOMIC_RELAXED);
    __atomic_add_fetch(&g->launches, 1, __ATOMIC_RELAXED);
    if (waited > 0)
        __atomic_add_fetch(&g->throttled_ns, waited, __ATOMIC_RELAXED);
}

/* Charge (ns > 0) or refund (ns < 0) outside the gate. */
static void charge(int gpu, int64_t ns)
{
    if (ns == 0)
        return;
    struct tessera_region_gpu *g = &shim.region.map->gpus[gpu];
    __atomic_sub_fetch(&g->budget_ns, ns, __ATOMIC_ACQ_REL);
    if (ns > 0)
        __atomic_add_fetch(&g->charged_ns, (uint64_t)ns, __ATOMIC_RELAXED);
    else
        __atomic_sub_fetch(&g->charged_ns, (uint64_t)-ns, __ATOMIC_RELAXED);
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

/* A finished measurement: a new sample, and the shape's ledger re-settled to the estimate. */
static void settle(struct pending *p, float ms)
{
    struct shape *s = shape_of(p->key);
    if (s->pending > 0)
        s->pending--;
    int64_t ns = (int64_t)((double)ms * 1e6);
    if (ns < 0)
        ns = 0;
    add_sample(s, ns);
    if (!p->capped)
        return;
    int64_t owed = (int64_t)s->ledger_n * s->estimate - s->ledger_charged;
    s->ledger_charged += owed;
    charge(p->gpu, owed);
    __atomic_store_n(&shim.region.map->gpus[p->gpu].hint_ns, s->estimate > 0 ? s->estimate : 1,
                     __ATOMIC_RELAXED);
}

/* Collect finished measurements, oldest first. With `block_key`, wait (polling) until a
 * measurement of that shape has settled. Called with `mu` held. */
static void collect(uint64_t block_key)
{
    while (pending_count > 0) {
        struct pending *p = &pending[pending_head];
        if (block_key == 0) {
            uint64_t now = tessera_now_ns();
            if (now < p->due_ns)
                return;
        }
        CUresult q = shim_real.cuEventQuery(p->end);
        if (q == CUDA_ERROR_NOT_READY) {
            if (block_key == 0) {
                p->due_ns = tessera_now_ns() + MIN_POLL_NS;
                return;
            }
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
    l->active = false;
    l->measure = false;
    if (!shim_devices_ready())
        return;
    int dev = -1;
    CUcontext ctx = NULL;
    if (!shim_current_device(&dev, &ctx))
        return;
    const struct shim_device *d = shim_device(dev);
    if (d == NULL || (d->cores == 0 && d->board < 0))
        return;
    if (shim_stream_capturing(stream, ptsz))
        return; /* recorded into a graph, not run: charged when the graph launches */
    bool high = d->board >= 0 && d->priority == TESSERA_PRIORITY_HIGH;
    if (d->board >= 0 && !high)
        shim_priority_hold(d->board, &shim.region.map->gpus[d->gpu]);
    if (d->cores == 0 && !high)
        return;
    l->active = true;
    l->capped = d->cores > 0;
    l->gpu = d->gpu;
    l->key = key;
    l->ctx = ctx;
    l->stream = stream;
    struct tessera_region_gpu *g = &shim.region.map->gpus[l->gpu];

    pthread_mutex_lock(&mu);
    struct shape *s = shape_of(key);
    collect(s->estimate < 0 && s->pending > 0 ? key : 0);
    s = shape_of(key);
    int64_t expect = s->estimate;
    if (expect < 0) {
        expect = __atomic_load_n(&g->hint_ns, __ATOMIC_RELAXED);
        if (expect <= 0)
            expect = BURST_NS;
    }
    l->measure = s->samples + s->pending < WARMUP || s->launches % SAMPLE_EVERY == 0;
    s->launches++;
    if (l->capped) {
        if (s->ledger_n >= HORIZON) {
            s->ledger_gen++;
            s->ledger_n = 0;
            s->ledger_charged = 0;
        }
        s->ledger_n++;
        s->ledger_charged += expect;
        l->ledger_gen = s->ledger_gen;
    }
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

    if (l->capped)
        gate_and_charge(g, d->cores, expect);
    l->charged_ns = l->capped ? expect : 0;
    l->expect_ns = expect;
    if (high)
        shim_priority_publish(d->board, expect);
    if (l->measure && shim_real.cuEventRecord(l->start, stream) != CUDA_SUCCESS) {
        pthread_mutex_lock(&mu);
        s = shape_of(key);
        if (s->pending > 0)
            s->pending--;
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
    if (rc != CUDA_SUCCESS && l->capped) {
        /* It never ran: refund it and take it out of its ledger. */
        charge(l->gpu, -l->charged_ns);
        pthread_mutex_lock(&mu);
        struct shape *s = shape_of(l->key);
        if (s->ledger_gen == l->ledger_gen && s->ledger_n > 0) {
            s->ledger_n--;
            s->ledger_charged -= l->charged_ns;
        }
        pthread_mutex_unlock(&mu);
    }
    if (!l->measure)
        return;
    bool recorded = rc == CUDA_SUCCESS && shim_real.cuEventRecord(l->end, l->stream) == CUDA_SUCCESS;
    pthread_mutex_lock(&mu);
    if (recorded && pending_count < PENDING) {
        pending[(pending_head + pending_count) % PENDING] = (struct pending){
            .start = l->start, .end = l->end, .ctx = l->ctx, .key = l->key, .gpu = l->gpu,
            .capped = l->capped, .due_ns = tessera_now_ns() + (uint64_t)l->expect_ns};
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
