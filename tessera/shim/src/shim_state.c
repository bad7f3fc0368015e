/*
 * Per-process state of the CUDA shim: lazy initialisation, the ordinal -> UUID -> limit map, the
 * process's slot in the usage region, and fork handling. See shim_state.h.
 */
#include <inttypes.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>

#include "compute.h"
#include "graph_mem.h"
#include "keylock.h"
#include "limits_source.h"
#include "log.h"
#include "pools.h"
#include "priority.h"
#include "ptrtable.h"
#include "shim_state.h"

struct shim_state shim = {.device_count = -1, .region = {.fd = -1, .slot = -1}};
int shim_launch_passthrough = 0;

static pthread_mutex_t init_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_mutex_t slot_mu = PTHREAD_MUTEX_INITIALIZER;
static int limit_gpu[TESSERA_MAX_GPUS]; /* region GPU index of limits.gpus[i] */

static void stop_process(const char *why) __attribute__((noreturn));

static void stop_process(const char *why)
{
    char line[1200];
    int n = snprintf(line, sizeof line,
                     "tessera-shim[%d]: fatal: %s; stopping (GPU limits cannot be enforced)\n",
                     (int)getpid(), why);
    ssize_t w = write(2, line, n > 0 && (size_t)n < sizeof line ? (size_t)n : sizeof line - 1);
    (void)w;
    _exit(TESSERA_EXIT_BAD_LIMITS);
}

static void prepare_fork(void)
{
    pthread_mutex_lock(&init_mu);
    pthread_mutex_lock(&slot_mu);
    shim_compute_prepare_fork();
    shim_keylock_prepare_fork();
    shim_table_prepare_fork();
}

static void parent_after_fork(void)
{
    shim_table_parent_after_fork();
    shim_keylock_parent_after_fork();
    shim_compute_parent_after_fork();
    pthread_mutex_unlock(&slot_mu);
    pthread_mutex_unlock(&init_mu);
}

static void child_after_fork(void)
{
    pthread_mutex_t fresh = PTHREAD_MUTEX_INITIALIZER;
    init_mu = fresh;
    slot_mu = fresh;
    shim_table_child_after_fork();
    shim_keylock_child_after_fork();
    shim_pools_child_after_fork();
    shim_graph_child_after_fork();
    shim_compute_child_after_fork();
    if (shim.region.map != NULL)
        tessera_region_after_fork_child(&shim.region); /* failing, it leaves region.fd -1 */
    /* The parent's contexts are not the child's; the ordinal map stays valid. */
    for (int i = 0; i < SHIM_MAX_DEVICES; i++)
        shim.devices[i].primary = NULL;
}

static void fmt_bytes(uint64_t b, char *out, size_t n)
{
    if (b == TESSERA_NO_MEMORY_LIMIT)
        snprintf(out, n, "unlimited");
    else if (b >= (1ULL << 30) && b % (1ULL << 20) == 0)
        snprintf(out, n, "%.2f GiB", (double)b / (double)(1ULL << 30));
    else if (b >= (1ULL << 20) && b % (1ULL << 10) == 0)
        snprintf(out, n, "%.2f MiB", (double)b / (double)(1ULL << 20));
    else
        snprintf(out, n, "%" PRIu64 " B", b);
}

static void summary(const char *limits_path, const char *region_path)
{
    char line[900];
    size_t pos = 0;
    for (uint32_t i = 0; i < shim.limits.count && pos < sizeof line; i++) {
        const struct tessera_gpu_limit *g = &shim.limits.gpus[i];
        char mem[32];
        fmt_bytes(g->memory_bytes, mem, sizeof mem);
        char cores[16];
        if (g->cores == 0 || g->cores >= 100)
            snprintf(cores, sizeof cores, "uncapped");
        else
            snprintf(cores, sizeof cores, "%u%%", g->cores);
        int n = snprintf(line + pos, sizeof line - pos, "%s%s memory %s compute %s priority %s",
                         i ? "; " : "", g->uuid, mem, cores,
                         g->priority == TESSERA_PRIORITY_HIGH ? "high" : "low");
        if (n > 0)
            pos += (size_t)n;
    }
    if (shim.limits.count == 0)
        snprintf(line, sizeof line, "no GPU listed");
    SHIM_INFO("limits from %s: %s; usage region %s", limits_path, line,
              region_path != NULL ? region_path : "private to this process");
}

static void do_init(void)
{
    shim_log_init();
    if (shim_real_resolve() != 0)
        stop_process("the real CUDA driver is missing or lacks entry points the shim needs");
    shim.calls = (struct shim_hot_calls){.cuCtxGetCurrent = shim_real.cuCtxGetCurrent,
                                         .cuMemAlloc_v2 = shim_real.cuMemAlloc_v2,
                                         .cuMemFree_v2 = shim_real.cuMemFree_v2};

    struct tessera_limits_source source;
    char err[600];
    if (tessera_limits_load(&source, &shim.limits, err, sizeof err) != 0)
        stop_process(err);
    if (source.origin == TESSERA_LIMITS_NONE) {
        SHIM_INFO("no limits: %s", source.why);
        shim_launch_passthrough = 1;
        return;
    }
    shim.limited = true;
    shim.prepared = source.origin == TESSERA_LIMITS_PREPARED;
    const char *named = getenv(TESSERA_LIMITS_ENV);
    if (shim.prepared && named != NULL && strcmp(named, TESSERA_CONTAINER_LIMITS) != 0)
        SHIM_WARN("ignoring %s=%s: a prepared container's limits are at %s", TESSERA_LIMITS_ENV,
                  named, TESSERA_CONTAINER_LIMITS);
    const char *region = source.region_path;
    if (region != NULL) {
        if (tessera_region_open(region, &shim.region, err, sizeof err) != 0) {
            tessera_limits_source_explain(&source, err, sizeof err);
            stop_process(err);
        }
    } else {
        SHIM_WARN("%s is not set: limits apply to each process on its own", TESSERA_REGION_ENV);
        if (tessera_region_open_private(&shim.region, err, sizeof err) != 0)
            stop_process(err);
    }
    for (uint32_t i = 0; i < shim.limits.count; i++) {
        const struct tessera_gpu_limit *g = &shim.limits.gpus[i];
        limit_gpu[i] = tessera_region_gpu(shim.region.map, g->uuid);
        if (limit_gpu[i] < 0)
            stop_process("the usage region's GPU table is full or corrupt");
        if (g->memory_bytes != TESSERA_NO_MEMORY_LIMIT)
            shim.memory_limited = true;
        if (g->cores > 0 && g->cores < 100)
            shim.compute_capped = true;
    }
    shim.prioritised = shim_priority_open(&shim.limits, source.priority_dir, shim.prepared);
    tessera_limits_source_release(&source);
    if (shim.prepared)
        summary(TESSERA_CONTAINER_LIMITS, TESSERA_CONTAINER_REGION);
    else
        summary(source.limits_path, region);
    __atomic_store_n(&shim_launch_passthrough, shim.compute_capped || shim.prioritised ? 0 : 1,
                     __ATOMIC_RELEASE);
}

void shim_init_once(void)
{
    pthread_mutex_lock(&init_mu);
    if (!shim.init_done) {
        static bool atfork_registered = false; /* registrations survive fork: once per image */
        if (!atfork_registered) {
            pthread_atfork(prepare_fork, parent_after_fork, child_after_fork);
            atfork_registered = true;
        }
        do_init();
        __atomic_store_n(&shim.init_done, 1, __ATOMIC_RELEASE);
    }
    pthread_mutex_unlock(&init_mu);
}

static void uuid_string(const CUuuid *u, char *out, size_t n)
{
    const unsigned char *b = (const unsigned char *)u->bytes;
    snprintf(out, n,
             "GPU-%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x%02x", b[0],
             b[1], b[2], b[3], b[4], b[5], b[6], b[7], b[8], b[9], b[10], b[11], b[12], b[13],
             b[14], b[15]);
}

/* Loud when a limit cannot apply: a GPU of the limits file that no CUDA device of this process
 * is (another node's GPU, a stale file, or one CUDA_VISIBLE_DEVICES hides) limits nothing here. */
static void warn_unmatched(const bool *matched, int count)
{
    const char *visible = getenv("CUDA_VISIBLE_DEVICES");
    for (uint32_t j = 0; j < shim.limits.count; j++) {
        if (matched[j])
            continue;
        SHIM_WARN("the limits file names GPU %s, which is none of the %d CUDA devices this "
                  "process sees (CUDA_VISIBLE_DEVICES=%s): its limits apply to nothing here",
                  shim.limits.gpus[j].uuid, count, visible != NULL ? visible : "unset");
    }
}

/* In a prepared container a GPU its claim does not name is none of the container's: however the
 * process came to see it (CUDA_VISIBLE_DEVICES changed, device nodes from elsewhere), it gets no
 * memory and the smallest compute share, accounted in the region like a claimed GPU. */
static void deny_unclaimed(int ordinal, struct shim_device *d)
{
    d->gpu = tessera_region_gpu(shim.region.map, d->uuid);
    if (d->gpu < 0)
        stop_process("the usage region's GPU table is full or corrupt");
    d->memory_limit = 0;
    d->cores = 1;
    d->priority = TESSERA_PRIORITY_LOW;
    d->board = -1;
    shim.memory_limited = true;
    shim.compute_capped = true;
    __atomic_store_n(&shim_launch_passthrough, 0, __ATOMIC_RELEASE);
    SHIM_WARN("CUDA device %d (%s) is not part of this container's claim: no memory and 1%% of "
              "its time",
              ordinal, d->uuid);
}

bool shim_devices_ready(void)
{
    if (SHIM_LIKELY(__atomic_load_n(&shim.device_count, __ATOMIC_ACQUIRE) >= 0))
        return true;
    shim_init();
    int count = 0;
    if (shim_real.cuDeviceGetCount(&count) != CUDA_SUCCESS)
        return false;
    pthread_mutex_lock(&init_mu);
    if (shim.device_count < 0) {
        if (count > SHIM_MAX_DEVICES)
            count = SHIM_MAX_DEVICES;
        bool matched[TESSERA_MAX_GPUS] = {false};
        for (int i = 0; i < count; i++) {
            struct shim_device *d = &shim.devices[i];
            d->gpu = -1;
            d->memory_limit = TESSERA_NO_MEMORY_LIMIT;
            d->cores = 0;
            d->priority = TESSERA_PRIORITY_LOW;
            d->board = -1;
            CUdevice dev = 0;
            CUuuid u;
            if (shim_real.cuDeviceGet(&dev, i) != CUDA_SUCCESS ||
                shim_real.cuDeviceGetUuid(&u, dev) != CUDA_SUCCESS) {
                SHIM_WARN("cannot read the UUID of CUDA device %d; it is not limited", i);
                continue;
            }
            uuid_string(&u, d->uuid, sizeof d->uuid);
            for (uint32_t j = 0; j < shim.limits.count; j++) {
                const struct tessera_gpu_limit *g = &shim.limits.gpus[j];
                if (strcasecmp(g->uuid, d->uuid) != 0)
                    continue;
                matched[j] = true;
                d->gpu = limit_gpu[j];
                d->memory_limit = g->memory_bytes;
                d->cores = g->cores >= 100 ? 0 : g->cores;
                d->priority = g->priority;
                d->board = shim_priority_board(j);
            }
            if (d->gpu < 0 && shim.prepared)
                deny_unclaimed(i, d);
            SHIM_DEBUG("CUDA device %d is %s: %s", i, d->uuid,
                       d->gpu >= 0 ? "limited" : "not in the limits file");
        }
        if (shim.limited)
            warn_unmatched(matched, count);
        __atomic_store_n(&shim.device_count, count, __ATOMIC_RELEASE);
    }
    pthread_mutex_unlock(&init_mu);
    return true;
}

const struct shim_device *shim_device(int dev)
{
    if (dev < 0 || dev >= __atomic_load_n(&shim.device_count, __ATOMIC_ACQUIRE))
        return NULL;
    const struct shim_device *d = &shim.devices[dev];
    return d->gpu >= 0 ? d : NULL;
}

/* The calling thread's last answer, valid while no context has been forgotten since (a
 * destroyed context's handle can come back for another device). Spares the table's lock on the
 * calls that ask often (cuMemGetInfo, every allocation). Initial-exec: read at a fixed offset
 * from the thread pointer, not through a call into the loader (__tls_get_addr, whose lookups
 * missed the cache on every allocation); the shim is preloaded, and a library loaded later with
 * dlopen gets these 24 bytes from the static TLS the loader keeps spare for that. */
static __thread struct {
    CUcontext ctx;
    int device;
    uint64_t forgotten;
} last_context __attribute__((tls_model("initial-exec")));

/* The device of `ctx`, which the thread's last answer did not give: the table's, else the
 * driver's. Out of line, so that its frame (a table entry) is not on the stack of every call. */
static __attribute__((noinline)) bool context_device(CUcontext ctx, uint64_t forgotten,
                                                     int *device)
{
    struct shim_entry e;
    if (shim_table_get(SHIM_KIND_CONTEXT, (uint64_t)(uintptr_t)ctx, &e)) {
        *device = e.device;
        last_context.ctx = ctx;
        last_context.device = e.device;
        last_context.forgotten = forgotten;
        return true;
    }
    CUdevice dev = 0;
    if (shim_real.cuCtxGetDevice(&dev) != CUDA_SUCCESS)
        return false;
    e = (struct shim_entry){.key = (uint64_t)(uintptr_t)ctx, .kind = SHIM_KIND_CONTEXT,
                            .device = dev, .gpu = -1};
    shim_table_put(&e);
    *device = dev;
    return true;
}

bool shim_current_device(int *device, CUcontext *pctx)
{
    CUcontext ctx = NULL;
    if (shim.calls.cuCtxGetCurrent(&ctx) != CUDA_SUCCESS || ctx == NULL)
        return false;
    if (pctx != NULL)
        *pctx = ctx;
    /* One device (the usual container of a fractional claim): every context is on it, and
     * neither the thread's cache nor the table need be read. */
    if (SHIM_LIKELY(__atomic_load_n(&shim.device_count, __ATOMIC_ACQUIRE) == 1)) {
        *device = 0;
        return true;
    }
    uint64_t forgotten = __atomic_load_n(&shim.contexts_forgotten, __ATOMIC_ACQUIRE);
    if (ctx == last_context.ctx && forgotten == last_context.forgotten) {
        *device = last_context.device;
        return true;
    }
    return context_device(ctx, forgotten, device);
}

void shim_forget_context(CUcontext ctx)
{
    shim_table_take(SHIM_KIND_CONTEXT, (uint64_t)(uintptr_t)ctx, NULL);
    __atomic_add_fetch(&shim.contexts_forgotten, 1, __ATOMIC_RELEASE);
}

bool shim_slot(void)
{
    if (SHIM_LIKELY(shim.region.slot >= 0))
        return true;
    pthread_mutex_lock(&slot_mu);
    int got = shim.region.slot < 0 && shim.region.map != NULL
                  ? tessera_region_claim_slot(&shim.region)
                  : 0;
    if (got == -1)
        SHIM_ERROR("all %d process slots of the usage region are held by live processes",
                   TESSERA_REGION_SLOTS);
    else if (got == -2)
        SHIM_ERROR("the usage region's descriptor is gone (closed by the application, or not "
                   "opened again after a fork): this process takes no memory on GPUs with a "
                   "memory limit");
    pthread_mutex_unlock(&slot_mu);
    return shim.region.slot >= 0;
}

/* At exit the process's memory goes back to the claim at once rather than when the next sweep
 * notices the death. The slot stays this process's until it is gone. */
__attribute__((destructor)) static void shim_at_exit(void)
{
    if (shim.region.map != NULL && shim.region.slot >= 0)
        tessera_region_drop_usage(&shim.region);
}
