/*
 * Drives the enforcement shim from the outside, the way applications reach libcuda: dlopen of
 * "libcuda.so.1" + dlsym (and cuGetProcAddress where a mode says so). Runs unchanged against a
 * real GPU (the kernel is the PTX in simgpu_test.h). One mode per invocation; results are
 * printed as "key=value" lines for the pytest side to check.
 *
 *   shim_probe info                        memory as the process sees it on $PROBE_DEVICE
 *   shim_probe alloc API BYTES [hold]      allocate with API, report, optionally wait on stdin,
 *                                          free, report again
 *   shim_probe devices                     per ordinal: UUID, cuDeviceTotalMem, cuMemGetInfo
 *   shim_probe race THREADS ITERS MAXBYTES SEED   random alloc/free from THREADS threads
 *   shim_probe loop                        alloc/free forever (to be SIGKILLed)
 *   shim_probe fork BYTES                  fork while allocating; child and parent checks
 *   shim_probe caching LIMIT BLOCK         a caching allocator: grow, split, reuse, release
 *   shim_probe poolcache THRESHOLD BYTES [hold]   stream-ordered memory cached by a pool
 *   shim_probe pools                       create pools until refused
 *   shim_probe poolgrowth STEP... [hold]   allocate sizes (KiB) from a pool; "free": free the last
 *                                          one, "pool": allocate from a new pool from now on
 *   shim_probe pooldestroy HOW             destroy a pool with allocations out, then free them;
 *                                          the last with HOW: async, sync (cuMemFree) or ctx
 *                                          (destroy their context)
 *   shim_probe duty NS SECONDS DEPTH [graph|graph4|coop|ex|capture]   keep the GPU busy with NS-long kernels
 *                                          (graph4: a graph of four NS/4 kernel nodes);
 *                                          reports the share of GPU time its kernels took and
 *                                          run_delay_ns, how long it waited for a CPU meanwhile
 *   shim_probe latency NS SECONDS GAP_NS   launch an NS-long kernel, wait for it, sleep GAP_NS, over
 *                                          and over: the launch-to-completion latency's percentiles
 *   shim_probe bench N                     ns per call: launch, alloc, free (with 10000 live),
 *                                          cuMemGetInfo_v2, launch of a one-node graph
 *   shim_probe graph_mem HOW BYTES [again|twice|alloc]   a graph allocating BYTES (HOW: node
 *                                          two_devices addnode capture capture_ptsz pool)
 *                                          instantiated, launched, destroyed, trimmed; "again": a
 *                                          second one before the trim; "twice": the same graph
 *                                          instantiated again while the first executable exists;
 *                                          "alloc": cuMemAlloc of BYTES before the trim
 *   shim_probe signals                     the application's signal handlers survive CUDA use
 *
 * API: mem pitch managed async async_ptsz pool pool_ptsz vmm array array3d
 *      procaddr procaddr_v2 procaddr_v2_ptsz legacy
 */
#include <errno.h>
#include <pthread.h>
#include <stdbool.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include "simgpu_test.h"

static void *lib;
static int device;
static CUstream alloc_stream; /* the stream of stream-ordered allocations and frees */

#define CHECK(call)                                                                               \
    do {                                                                                          \
        CUresult rc_ = (call);                                                                    \
        if (rc_ != CUDA_SUCCESS) {                                                                \
            fprintf(stderr, "%s:%d: %s = %d\n", __FILE__, __LINE__, #call, (int)rc_);             \
            exit(3);                                                                              \
        }                                                                                         \
    } while (0)

static CUcontext setup(void)
{
    LOAD(lib, cuInit);
    LOAD(lib, cuDevicePrimaryCtxRetain);
    LOAD(lib, cuCtxSetCurrent);
    CHECK(p_cuInit(0));
    CUcontext ctx = NULL;
    CHECK(p_cuDevicePrimaryCtxRetain(&ctx, device));
    CHECK(p_cuCtxSetCurrent(ctx));
    return ctx;
}

static void report(const char *prefix)
{
    LOAD(lib, cuMemGetInfo_v2);
    LOAD(lib, cuDeviceTotalMem_v2);
    size_t free_b = 0, total = 0, devtotal = 0;
    CHECK(p_cuMemGetInfo_v2(&free_b, &total));
    CHECK(p_cuDeviceTotalMem_v2(&devtotal, device));
    printf("%sfree=%zu total=%zu used=%zu devtotal=%zu\n", prefix, free_b, total, total - free_b,
           devtotal);
}

/* ------------------------------------------------------------------------- alloc ------- */

struct held {
    const char *api;
    CUdeviceptr ptr;
    CUarray array;
    CUmemGenericAllocationHandle handle;
    CUmemoryPool pool;
    size_t size;
};

static CUresult get_proc(const char *getter, const char *name, void **fn)
{
    CUdriverProcAddressQueryResult st;
    if (strcmp(getter, "procaddr") == 0) {
        LOAD(lib, cuGetProcAddress);
        return p_cuGetProcAddress(name, fn, 12000, CU_GET_PROC_ADDRESS_DEFAULT);
    }
    if (strcmp(getter, "procaddr_v2") == 0) {
        LOAD(lib, cuGetProcAddress_v2);
        return p_cuGetProcAddress_v2(name, fn, 12000, CU_GET_PROC_ADDRESS_DEFAULT, &st);
    }
    __typeof__(&cuGetProcAddress_v2) p =
        (__typeof__(&cuGetProcAddress_v2))test_sym(lib, "cuGetProcAddress_v2_ptsz");
    return p(name, fn, 12000, CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM, &st);
}

static CUresult do_alloc(struct held *h)
{
    const char *api = h->api;
    size_t size = h->size;
    if (strcmp(api, "mem") == 0) {
        LOAD(lib, cuMemAlloc_v2);
        return p_cuMemAlloc_v2(&h->ptr, size);
    }
    if (strcmp(api, "pitch") == 0) {
        LOAD(lib, cuMemAllocPitch_v2);
        size_t pitch = 0;
        return p_cuMemAllocPitch_v2(&h->ptr, &pitch, size / 1024, 1024, 4);
    }
    if (strcmp(api, "managed") == 0) {
        LOAD(lib, cuMemAllocManaged);
        return p_cuMemAllocManaged(&h->ptr, size, CU_MEM_ATTACH_GLOBAL);
    }
    if (strncmp(api, "async", 5) == 0) {
        __typeof__(&cuMemAllocAsync) p = (__typeof__(&cuMemAllocAsync))test_sym(
            lib, strcmp(api, "async_ptsz") == 0 ? "cuMemAllocAsync_ptsz" : "cuMemAllocAsync");
        return p(&h->ptr, size, alloc_stream);
    }
    if (strncmp(api, "pool", 4) == 0) {
        LOAD(lib, cuMemPoolCreate);
        CUmemPoolProps props;
        memset(&props, 0, sizeof props);
        props.allocType = CU_MEM_ALLOCATION_TYPE_PINNED;
        props.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
        props.location.id = device;
        CHECK(p_cuMemPoolCreate(&h->pool, &props));
        __typeof__(&cuMemAllocFromPoolAsync) p = (__typeof__(&cuMemAllocFromPoolAsync))test_sym(
            lib, strcmp(api, "pool_ptsz") == 0 ? "cuMemAllocFromPoolAsync_ptsz"
                                               : "cuMemAllocFromPoolAsync");
        return p(&h->ptr, size, h->pool, alloc_stream);
    }
    if (strcmp(api, "vmm") == 0) {
        LOAD(lib, cuMemCreate);
        LOAD(lib, cuMemAddressReserve);
        LOAD(lib, cuMemMap);
        LOAD(lib, cuMemGetAllocationGranularity);
        CUmemAllocationProp prop;
        memset(&prop, 0, sizeof prop);
        prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
        prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
        prop.location.id = device;
        size_t gran = 0;
        CHECK(p_cuMemGetAllocationGranularity(&gran, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM));
        h->size = size = (size + gran - 1) / gran * gran;
        CUresult rc = p_cuMemCreate(&h->handle, size, &prop, 0);
        if (rc != CUDA_SUCCESS)
            return rc;
        CHECK(p_cuMemAddressReserve(&h->ptr, size, 0, 0, 0));
        return p_cuMemMap(h->ptr, size, 0, h->handle, 0);
    }
    if (strcmp(api, "array") == 0) {
        LOAD(lib, cuArrayCreate_v2);
        CUDA_ARRAY_DESCRIPTOR d = {size / 4096, 1024, CU_AD_FORMAT_UNSIGNED_INT32, 1};
        return p_cuArrayCreate_v2(&h->array, &d);
    }
    if (strcmp(api, "array3d") == 0) {
        LOAD(lib, cuArray3DCreate_v2);
        CUDA_ARRAY3D_DESCRIPTOR d = {size / 4096, 64, 16, CU_AD_FORMAT_UNSIGNED_INT8, 4, 0};
        return p_cuArray3DCreate_v2(&h->array, &d);
    }
    if (strncmp(api, "procaddr", 8) == 0) {
        void *fn = NULL;
        CHECK(get_proc(api, "cuMemAlloc", &fn));
        return ((__typeof__(&cuMemAlloc_v2))fn)(&h->ptr, size);
    }
    if (strcmp(api, "legacy") == 0) {
        /* The CUDA 2.x ABI: 32-bit size and pointer. */
        CUresult (*p)(unsigned int *, unsigned int) =
            (CUresult(*)(unsigned int *, unsigned int))dlsym(lib, "cuMemAlloc");
        unsigned int small = 0;
        if (p == NULL)
            return CUDA_ERROR_NOT_FOUND;
        return p(&small, (unsigned int)size);
    }
    fprintf(stderr, "unknown api %s\n", api);
    exit(2);
}

static CUresult do_free(struct held *h)
{
    const char *api = h->api;
    if (strcmp(api, "vmm") == 0) {
        LOAD(lib, cuMemUnmap);
        LOAD(lib, cuMemRelease);
        LOAD(lib, cuMemAddressFree);
        CHECK(p_cuMemRelease(h->handle)); /* still mapped: the memory stays taken */
        report("released_mapped: ");
        CHECK(p_cuMemUnmap(h->ptr, h->size));
        return p_cuMemAddressFree(h->ptr, h->size);
    }
    if (strncmp(api, "array", 5) == 0) {
        LOAD(lib, cuArrayDestroy);
        return p_cuArrayDestroy(h->array);
    }
    if (strncmp(api, "async", 5) == 0 || strncmp(api, "pool", 4) == 0) {
        bool ptsz = strstr(api, "ptsz") != NULL;
        __typeof__(&cuMemFreeAsync) p = (__typeof__(&cuMemFreeAsync))test_sym(
            lib, ptsz ? "cuMemFreeAsync_ptsz" : "cuMemFreeAsync");
        LOAD(lib, cuCtxSynchronize);
        CUresult rc = p(h->ptr, alloc_stream);
        p_cuCtxSynchronize();
        if (h->pool != NULL) {
            LOAD(lib, cuMemPoolDestroy);
            CHECK(p_cuMemPoolDestroy(h->pool));
        }
        return rc;
    }
    if (strncmp(api, "procaddr", 8) == 0) {
        void *fn = NULL;
        CHECK(get_proc(api, "cuMemFree", &fn));
        return ((__typeof__(&cuMemFree_v2))fn)(h->ptr);
    }
    LOAD(lib, cuMemFree_v2);
    return p_cuMemFree_v2(h->ptr);
}

static int mode_alloc(int argc, char **argv)
{
    if (argc < 4)
        return 2;
    setup();
    struct held h = {.api = argv[2], .size = strtoull(argv[3], NULL, 0)};
    CUresult rc = do_alloc(&h);
    printf("rc=%d\n", (int)rc);
    report("");
    if (rc != CUDA_SUCCESS)
        return 0;
    if (argc > 4 && strcmp(argv[4], "hold") == 0) {
        printf("HOLD\n");
        fflush(stdout);
        char buf[16];
        while (read(0, buf, sizeof buf) > 0)
            ;
    }
    printf("free_rc=%d\n", (int)do_free(&h));
    report("after: ");
    return 0;
}

/* ------------------------------------------------------------------------- capture ----- */

/* API async/pool on a created stream, async_ptsz/pool_ptsz on the per-thread default stream. */
/* A graph that allocates BYTES and frees them, built as `how` says: "node" (cuGraphAddMemAllocNode
 * and cuGraphAddMemFreeNode), "two_devices" (BYTES on this device and BYTES on the next, not
 * freed), "addnode" (cuGraphAddNode), or captured from a stream: "capture"
 * (cuMemAllocAsync/cuMemFreeAsync), "capture_ptsz" (their _ptsz forms on the per-thread default
 * stream), "pool" (cuMemAllocFromPoolAsync from the device's pool). */
static CUgraph build_graph(const char *how, size_t bytes)
{
    LOAD(lib, cuGraphCreate);
    CUgraph g = NULL;
    CUDA_MEM_ALLOC_NODE_PARAMS p;
    memset(&p, 0, sizeof p);
    p.poolProps.allocType = CU_MEM_ALLOCATION_TYPE_PINNED;
    p.poolProps.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    p.poolProps.location.id = device;
    p.bytesize = bytes;
    if (strcmp(how, "node") == 0) {
        LOAD(lib, cuGraphAddMemAllocNode);
        LOAD(lib, cuGraphAddMemFreeNode);
        CUgraphNode a = NULL, f = NULL;
        CHECK(p_cuGraphCreate(&g, 0));
        CHECK(p_cuGraphAddMemAllocNode(&a, g, NULL, 0, &p));
        CHECK(p_cuGraphAddMemFreeNode(&f, g, &a, 1, p.dptr));
        return g;
    }
    if (strcmp(how, "two_devices") == 0) {
        LOAD(lib, cuGraphAddMemAllocNode);
        CUgraphNode a = NULL, b = NULL;
        CHECK(p_cuGraphCreate(&g, 0));
        CHECK(p_cuGraphAddMemAllocNode(&a, g, NULL, 0, &p));
        p.poolProps.location.id = device + 1;
        CHECK(p_cuGraphAddMemAllocNode(&b, g, &a, 1, &p));
        return g;
    }
    if (strcmp(how, "addnode") == 0) {
        LOAD(lib, cuGraphAddNode);
        CUgraphNode a = NULL, f = NULL;
        CUgraphNodeParams np;
        memset(&np, 0, sizeof np);
        np.type = CU_GRAPH_NODE_TYPE_MEM_ALLOC;
        np.alloc = p;
        CHECK(p_cuGraphCreate(&g, 0));
        CHECK(p_cuGraphAddNode(&a, g, NULL, 0, &np));
        CUdeviceptr dptr = np.alloc.dptr;
        memset(&np, 0, sizeof np);
        np.type = CU_GRAPH_NODE_TYPE_MEM_FREE;
        np.free.dptr = dptr;
        CHECK(p_cuGraphAddNode(&f, g, &a, 1, &np));
        return g;
    }
    bool ptsz = strcmp(how, "capture_ptsz") == 0;
    const char *alloc_name = ptsz ? "cuMemAllocAsync_ptsz" : "cuMemAllocAsync";
    __typeof__(&cuMemAllocAsync) alloc = (__typeof__(&cuMemAllocAsync))test_sym(lib, alloc_name);
    __typeof__(&cuMemFreeAsync) free_async = (__typeof__(&cuMemFreeAsync))test_sym(
        lib, ptsz ? "cuMemFreeAsync_ptsz" : "cuMemFreeAsync");
    CUresult (*begin)(CUstream, unsigned int) = (CUresult(*)(CUstream, unsigned int))test_sym(
        lib, ptsz ? "cuStreamBeginCapture_v2_ptsz" : "cuStreamBeginCapture_v2");
    CUresult (*end)(CUstream, CUgraph *) = (CUresult(*)(CUstream, CUgraph *))test_sym(
        lib, ptsz ? "cuStreamEndCapture_ptsz" : "cuStreamEndCapture");
    CUdeviceptr dptr = 0;
    CHECK(begin(alloc_stream, 0));
    if (strcmp(how, "pool") == 0) {
        LOAD(lib, cuDeviceGetMemPool);
        LOAD(lib, cuMemAllocFromPoolAsync);
        CUmemoryPool pool = NULL;
        CHECK(p_cuDeviceGetMemPool(&pool, device));
        CHECK(p_cuMemAllocFromPoolAsync(&dptr, bytes, pool, alloc_stream));
    } else {
        CHECK(alloc(&dptr, bytes, alloc_stream));
    }
    report("captured: ");
    CHECK(free_async(dptr, alloc_stream));
    CHECK(end(alloc_stream, &g));
    return g;
}

/* Instantiate `g`, launch it once if that succeeded, and report the charge at each step. */
static CUgraphExec instantiate_and_launch(CUgraph g, const char *prefix)
{
    LOAD(lib, cuGraphInstantiateWithFlags);
    LOAD(lib, cuGraphLaunch);
    LOAD(lib, cuStreamSynchronize);
    CUgraphExec e = NULL;
    CUresult rc = p_cuGraphInstantiateWithFlags(&e, g, 0);
    printf("%sinstantiate_rc=%d\n", prefix, (int)rc);
    if (rc != CUDA_SUCCESS)
        return NULL;
    char step[64];
    snprintf(step, sizeof step, "%sinstantiated: ", prefix);
    report(step);
    CHECK(p_cuGraphLaunch(e, alloc_stream));
    CHECK(p_cuStreamSynchronize(alloc_stream));
    snprintf(step, sizeof step, "%slaunched: ", prefix);
    report(step);
    return e;
}

/* graph_mem HOW BYTES [again|twice|alloc]: a graph allocating BYTES (build_graph) instantiated and
 * launched, then its executable destroyed and the graph memory trimmed, reporting the charge at
 * each step. With "again", a second such graph is instantiated after the first executable is
 * destroyed but before any trim, and destroyed; with "twice", the graph is instantiated a second
 * time while its first executable exists (which the driver refuses); with "alloc", BYTES are
 * allocated with cuMemAlloc after the executable is destroyed but before any trim, and freed. */
static int mode_graph_mem(int argc, char **argv)
{
    if (argc < 4)
        return 2;
    setup();
    LOAD(lib, cuStreamCreate);
    LOAD(lib, cuGraphExecDestroy);
    LOAD(lib, cuGraphDestroy);
    LOAD(lib, cuDeviceGraphMemTrim);
    if (strcmp(argv[2], "capture_ptsz") != 0)
        CHECK(p_cuStreamCreate(&alloc_stream, CU_STREAM_NON_BLOCKING));
    size_t bytes = strtoull(argv[3], NULL, 0);
    CUgraph g = build_graph(argv[2], bytes);
    report("built: ");
    CUgraphExec e = instantiate_and_launch(g, "");
    if (argc > 4 && strcmp(argv[4], "twice") == 0) {
        LOAD(lib, cuGraphInstantiateWithFlags);
        CUgraphExec e2 = NULL;
        printf("twice_rc=%d\n", (int)p_cuGraphInstantiateWithFlags(&e2, g, 0));
        report("twice: ");
    }
    if (e != NULL)
        CHECK(p_cuGraphExecDestroy(e));
    report("destroyed: ");
    if (argc > 4 && strcmp(argv[4], "again") == 0) {
        CUgraph second = build_graph(argv[2], bytes);
        CUgraphExec e2 = instantiate_and_launch(second, "second_");
        if (e2 != NULL)
            CHECK(p_cuGraphExecDestroy(e2));
        CHECK(p_cuGraphDestroy(second));
        report("second_destroyed: ");
    }
    if (argc > 4 && strcmp(argv[4], "alloc") == 0) {
        LOAD(lib, cuMemAlloc_v2);
        LOAD(lib, cuMemFree_v2);
        CUdeviceptr ptr = 0;
        CUresult rc = p_cuMemAlloc_v2(&ptr, bytes);
        printf("alloc_rc=%d\n", (int)rc);
        report("allocated: ");
        if (rc == CUDA_SUCCESS)
            CHECK(p_cuMemFree_v2(ptr));
    }
    CHECK(p_cuGraphDestroy(g));
    CHECK(p_cuDeviceGraphMemTrim(device));
    report("trimmed: ");
    return 0;
}

/* ------------------------------------------------------------------------- devices ----- */

static int mode_devices(void)
{
    LOAD(lib, cuInit);
    LOAD(lib, cuDeviceGetCount);
    LOAD(lib, cuDeviceGetUuid);
    LOAD(lib, cuDeviceTotalMem_v2);
    LOAD(lib, cuCtxCreate_v2);
    LOAD(lib, cuCtxDestroy_v2);
    LOAD(lib, cuMemGetInfo_v2);
    CHECK(p_cuInit(0));
    int n = 0;
    CHECK(p_cuDeviceGetCount(&n));
    printf("count=%d\n", n);
    for (int i = 0; i < n; i++) {
        CUuuid u;
        size_t total = 0, free_b = 0, ctx_total = 0;
        CHECK(p_cuDeviceGetUuid(&u, i));
        CHECK(p_cuDeviceTotalMem_v2(&total, i));
        CUcontext ctx;
        CHECK(p_cuCtxCreate_v2(&ctx, 0, i));
        CHECK(p_cuMemGetInfo_v2(&free_b, &ctx_total));
        CHECK(p_cuCtxDestroy_v2(ctx));
        const unsigned char *b = (const unsigned char *)u.bytes;
        printf("device=%d uuid=GPU-%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-"
               "%02x%02x%02x%02x%02x%02x total=%zu ctx_total=%zu\n",
               i, b[0], b[1], b[2], b[3], b[4], b[5], b[6], b[7], b[8], b[9], b[10], b[11], b[12],
               b[13], b[14], b[15], total, ctx_total);
    }
    return 0;
}

/* ------------------------------------------------------------------------- race -------- */

struct racer {
    CUcontext ctx;
    int iters;
    size_t max_bytes;
    unsigned seed;
    long ooms, other;
};

static void *race_thread(void *arg)
{
    struct racer *r = arg;
    LOAD(lib, cuCtxSetCurrent);
    LOAD(lib, cuMemAlloc_v2);
    LOAD(lib, cuMemFree_v2);
    p_cuCtxSetCurrent(r->ctx);
    enum { KEEP = 4 };
    CUdeviceptr held[KEEP] = {0};
    for (int i = 0; i < r->iters; i++) {
        int k = (int)(rand_r(&r->seed) % KEEP);
        if (held[k] != 0) {
            if (p_cuMemFree_v2(held[k]) != CUDA_SUCCESS)
                r->other++;
            held[k] = 0;
            continue;
        }
        size_t units = r->max_bytes / 512;
        size_t size = (1 + rand_r(&r->seed) % units) * 512;
        CUresult rc = p_cuMemAlloc_v2(&held[k], size);
        if (rc == CUDA_ERROR_OUT_OF_MEMORY)
            r->ooms++;
        else if (rc != CUDA_SUCCESS)
            r->other++;
    }
    for (int k = 0; k < KEEP; k++)
        if (held[k] != 0 && p_cuMemFree_v2(held[k]) != CUDA_SUCCESS)
            r->other++;
    return NULL;
}

static int mode_race(int argc, char **argv)
{
    if (argc < 6)
        return 2;
    CUcontext ctx = setup();
    int threads = atoi(argv[2]);
    struct racer r[64];
    pthread_t th[64];
    for (int t = 0; t < threads && t < 64; t++) {
        r[t] = (struct racer){ctx, atoi(argv[3]), strtoull(argv[4], NULL, 0),
                              (unsigned)(atoi(argv[5]) * 131 + t), 0, 0};
        pthread_create(&th[t], NULL, race_thread, &r[t]);
    }
    long ooms = 0, other = 0;
    for (int t = 0; t < threads && t < 64; t++) {
        pthread_join(th[t], NULL);
        ooms += r[t].ooms;
        other += r[t].other;
    }
    printf("ooms=%ld other=%ld\n", ooms, other);
    report("");
    return other == 0 ? 0 : 1;
}

static int mode_loop(void)
{
    setup();
    LOAD(lib, cuMemAlloc_v2);
    LOAD(lib, cuMemFree_v2);
    CUdeviceptr p;
    printf("LOOPING\n");
    fflush(stdout);
    for (unsigned i = 0;; i++) {
        if (p_cuMemAlloc_v2(&p, 512 * (1 + i % 64)) == CUDA_SUCCESS)
            p_cuMemFree_v2(p);
    }
    return 0;
}

/* ------------------------------------------------------------------------- fork -------- */

static volatile int stop_allocating;

static void *alloc_forever(void *arg)
{
    LOAD(lib, cuCtxSetCurrent);
    LOAD(lib, cuMemAlloc_v2);
    LOAD(lib, cuMemFree_v2);
    p_cuCtxSetCurrent((CUcontext)arg);
    CUdeviceptr p;
    while (!stop_allocating)
        if (p_cuMemAlloc_v2(&p, 4096) == CUDA_SUCCESS)
            p_cuMemFree_v2(p);
    return NULL;
}

static int mode_fork(int argc, char **argv)
{
    if (argc < 3)
        return 2;
    CUcontext ctx = setup();
    LOAD(lib, cuMemAlloc_v2);
    LOAD(lib, cuMemFree_v2);
    LOAD(lib, cuMemGetInfo_v2);
    size_t bytes = strtoull(argv[2], NULL, 0);
    CUdeviceptr p;
    CHECK(p_cuMemAlloc_v2(&p, bytes));
    report("parent_before: ");
    /* Fork many times while another thread allocates and frees: no child may hang on a lock
     * held at the moment of the fork, and nothing a child does changes the parent's usage. */
    pthread_t th;
    pthread_create(&th, NULL, alloc_forever, ctx);
    int hung = 0;
    for (int i = 0; i < 50 && hung == 0; i++) {
        pid_t pid = fork();
        if (pid == 0) {
            CUdeviceptr q;
            size_t f = 0, t = 0;
            CUresult a = p_cuMemAlloc_v2(&q, 4096); /* the driver refuses in a child */
            CUresult b = p_cuMemGetInfo_v2(&f, &t);
            exit(a == CUDA_SUCCESS || b == CUDA_SUCCESS ? 10 : 0);
        }
        /* A child that is not stuck exits within milliseconds; one still there after a minute
         * (however busy the machine) waits on a lock that nobody will release. The first one
         * found ends the forking. */
        int status = 0;
        for (int w = 0; w < 6000 && waitpid(pid, &status, WNOHANG) == 0; w++)
            usleep(10000);
        if (waitpid(pid, &status, WNOHANG) == 0) {
            kill(pid, SIGKILL);
            waitpid(pid, &status, 0);
            hung++;
        } else if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
            printf("child_status=%d\n", status);
        }
    }
    stop_allocating = 1;
    pthread_join(th, NULL);
    printf("hung=%d\n", hung);
    report("parent_after: ");
    CHECK(p_cuMemFree_v2(p));
    report("parent_freed: ");
    return 0;
}

/* ------------------------------------------------------------------------- caching ----- */

/* Like a framework's caching allocator: grab large blocks until the driver says no, carve them
 * into pieces, free pieces into a cache, reuse the cache, then on OOM release cached blocks and
 * retry - which must succeed, since the shim gives memory back as soon as a block is freed. */
static int mode_caching(int argc, char **argv)
{
    if (argc < 4)
        return 2;
    setup();
    LOAD(lib, cuMemAlloc_v2);
    LOAD(lib, cuMemFree_v2);
    LOAD(lib, cuMemGetInfo_v2);
    LOAD(lib, cuMemsetD8_v2);
    size_t limit = strtoull(argv[2], NULL, 0), block = strtoull(argv[3], NULL, 0);
    enum { MAX_BLOCKS = 4096 };
    static CUdeviceptr blocks[MAX_BLOCKS];
    int n = 0;
    CUresult rc = CUDA_SUCCESS;
    size_t f = 0, t = 0;
    while (n < MAX_BLOCKS && (rc = p_cuMemAlloc_v2(&blocks[n], block)) == CUDA_SUCCESS) {
        n++;
        CHECK(p_cuMemGetInfo_v2(&f, &t));
        if (t - f != (size_t)n * block)
            printf("mismatch used=%zu want=%zu\n", t - f, (size_t)n * block);
    }
    printf("blocks=%d last_rc=%d within=%d\n", n, (int)rc, (size_t)n * block <= limit);
    /* Split: a piece is an offset inside a cached block, used with no allocation call of its own;
     * the shim must let work on it through (the block is charged once, not per piece). */
    CHECK(p_cuMemsetD8_v2(blocks[0] + block / 2, 0x5a, block / 2));
    /* Release half the cache, then a request of two blocks must fit where one did not. */
    int released = 0;
    for (int i = n - 1; i >= n / 2; i--, released++)
        CHECK(p_cuMemFree_v2(blocks[i]));
    n -= released;
    CUdeviceptr big;
    rc = p_cuMemAlloc_v2(&big, 2 * block);
    printf("retry_rc=%d\n", (int)rc);
    if (rc == CUDA_SUCCESS)
        CHECK(p_cuMemFree_v2(big));
    for (int i = 0; i < n; i++)
        CHECK(p_cuMemFree_v2(blocks[i]));
    report("end: ");
    return 0;
}

/* ------------------------------------------------------------------------- pool cache -- */

/* Stream-ordered memory through the current pool of the device, whose release threshold is
 * THRESHOLD: free (the pool caches it), sync, allocate the same size again (served from the
 * cache), ask cuMemAlloc for twice as much, free and cuMemPoolTrimTo. Reports after each step;
 * with "hold" it waits on stdin after the first free, holding the cache. */
static int mode_poolcache(int argc, char **argv)
{
    if (argc < 4)
        return 2;
    setup();
    LOAD(lib, cuStreamCreate);
    LOAD(lib, cuStreamSynchronize);
    LOAD(lib, cuMemAllocAsync);
    LOAD(lib, cuMemFreeAsync);
    LOAD(lib, cuMemAlloc_v2);
    LOAD(lib, cuMemFree_v2);
    LOAD(lib, cuDeviceGetMemPool);
    LOAD(lib, cuMemPoolSetAttribute);
    LOAD(lib, cuMemPoolTrimTo);
    cuuint64_t threshold = strtoull(argv[2], NULL, 0);
    size_t bytes = strtoull(argv[3], NULL, 0);
    CUstream s = NULL;
    CUmemoryPool pool = NULL;
    CUdeviceptr a = 0, big = 0;
    CHECK(p_cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
    CHECK(p_cuDeviceGetMemPool(&pool, device));
    CHECK(p_cuMemPoolSetAttribute(pool, CU_MEMPOOL_ATTR_RELEASE_THRESHOLD, &threshold));
    CHECK(p_cuMemAllocAsync(&a, bytes, s));
    CHECK(p_cuMemFreeAsync(a, s));
    report("freed: ");
    if (argc > 4 && strcmp(argv[4], "hold") == 0) {
        printf("HOLD\n");
        char buf[16];
        while (read(0, buf, sizeof buf) > 0)
            ;
    }
    CHECK(p_cuStreamSynchronize(s));
    report("synced: ");
    CHECK(p_cuMemAllocAsync(&a, bytes, s));
    report("again: ");
    CHECK(p_cuMemFreeAsync(a, s));
    CUresult rc = p_cuMemAlloc_v2(&big, 2 * bytes);
    printf("big_rc=%d\n", (int)rc);
    report("big: ");
    if (rc == CUDA_SUCCESS)
        CHECK(p_cuMemFree_v2(big));
    CHECK(p_cuMemAllocAsync(&a, bytes, s));
    CHECK(p_cuMemFreeAsync(a, s));
    report("refreed: ");
    CHECK(p_cuMemPoolTrimTo(pool, 0));
    report("trimmed: ");
    return 0;
}

/* Allocate each size (KiB) in turn from a new pool ("free": free the previous step's allocation;
 * "pool": a new pool from now on); after each step, print its result, the pool's reservation
 * and what the claim holds as cuMemGetInfo reports it (at most the limit). With "hold" it then
 * waits on stdin. Then free them all and trim the pools. */
static int mode_poolgrowth(int argc, char **argv)
{
    setup();
    LOAD(lib, cuStreamCreate);
    LOAD(lib, cuMemPoolCreate);
    LOAD(lib, cuMemPoolGetAttribute);
    LOAD(lib, cuMemPoolTrimTo);
    LOAD(lib, cuMemAllocFromPoolAsync);
    LOAD(lib, cuMemFreeAsync);
    LOAD(lib, cuMemGetInfo_v2);
    enum { MAX = 16 };
    CUdeviceptr ptrs[MAX] = {0};
    CUmemPoolProps props;
    memset(&props, 0, sizeof props);
    props.allocType = CU_MEM_ALLOCATION_TYPE_PINNED;
    props.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    props.location.id = device;
    CUmemoryPool pool = NULL;
    CUstream s = NULL;
    CHECK(p_cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
    CHECK(p_cuMemPoolCreate(&pool, &props));
    bool hold = argc > 2 && strcmp(argv[argc - 1], "hold") == 0;
    int n = argc - 2 - (hold ? 1 : 0);
    if (n > MAX)
        n = MAX;
    CUmemoryPool pools[MAX] = {pool};
    int npools = 1;
    for (int i = 0; i < n; i++) {
        size_t kib = 0;
        CUresult rc = CUDA_SUCCESS;
        if (strcmp(argv[2 + i], "free") == 0 && i > 0) {
            rc = p_cuMemFreeAsync(ptrs[i - 1], s);
            ptrs[i - 1] = 0;
        } else if (strcmp(argv[2 + i], "pool") == 0) {
            rc = p_cuMemPoolCreate(&pool, &props);
            pools[npools++] = pool;
        } else {
            kib = strtoull(argv[2 + i], NULL, 0);
            rc = p_cuMemAllocFromPoolAsync(&ptrs[i], kib << 10, pool, s);
        }
        if (rc != CUDA_SUCCESS)
            ptrs[i] = 0;
        cuuint64_t reserved = 0;
        size_t free_b = 0, total = 0;
        CHECK(p_cuMemPoolGetAttribute(pool, CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT, &reserved));
        CHECK(p_cuMemGetInfo_v2(&free_b, &total));
        printf("step%d: kib=%zu rc=%d reserved=%llu used=%zu\n", i, kib, (int)rc,
               (unsigned long long)reserved, total - free_b);
    }
    if (hold) {
        printf("HOLD\n");
        fflush(stdout);
        char buf[16];
        while (read(0, buf, sizeof buf) > 0)
            ;
    }
    for (int i = 0; i < n; i++)
        if (ptrs[i] != 0)
            CHECK(p_cuMemFreeAsync(ptrs[i], s));
    for (int i = 0; i < npools; i++)
        CHECK(p_cuMemPoolTrimTo(pools[i], 0));
    report("trimmed: ");
    return 0;
}

/* In a context of its own (HOW = ctx) or the primary one: allocate 1 MiB and 512 KiB from a new
 * pool, destroy the pool, free the 1 MiB with cuMemFreeAsync, then the 512 KiB with
 * cuMemFreeAsync (async), cuMemFree (sync) or by destroying the context (ctx), reporting what
 * the claim holds after each step. */
static int mode_pooldestroy(int argc, char **argv)
{
    CUcontext primary = setup();
    LOAD(lib, cuStreamCreate);
    LOAD(lib, cuCtxCreate_v2);
    LOAD(lib, cuCtxDestroy_v2);
    LOAD(lib, cuCtxSetCurrent);
    LOAD(lib, cuMemPoolCreate);
    LOAD(lib, cuMemPoolDestroy);
    LOAD(lib, cuMemAllocFromPoolAsync);
    LOAD(lib, cuMemFreeAsync);
    LOAD(lib, cuMemFree_v2);
    const char *how = argc > 2 ? argv[2] : "async";
    CUcontext ctx = NULL;
    if (strcmp(how, "ctx") == 0)
        CHECK(p_cuCtxCreate_v2(&ctx, 0, device));
    CUmemPoolProps props;
    memset(&props, 0, sizeof props);
    props.allocType = CU_MEM_ALLOCATION_TYPE_PINNED;
    props.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    props.location.id = device;
    CUmemoryPool pool = NULL;
    CUstream s = NULL;
    CUdeviceptr a = 0, b = 0;
    CHECK(p_cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
    CHECK(p_cuMemPoolCreate(&pool, &props));
    CHECK(p_cuMemAllocFromPoolAsync(&a, 1 << 20, pool, s));
    CHECK(p_cuMemAllocFromPoolAsync(&b, 512 << 10, pool, s));
    report("alloced: ");
    CHECK(p_cuMemPoolDestroy(pool));
    report("destroyed: ");
    CHECK(p_cuMemFreeAsync(a, s));
    report("one: ");
    if (strcmp(how, "sync") == 0) {
        CHECK(p_cuMemFree_v2(b));
    } else if (ctx != NULL) {
        CHECK(p_cuCtxDestroy_v2(ctx));
        CHECK(p_cuCtxSetCurrent(primary));
    } else {
        CHECK(p_cuMemFreeAsync(b, s));
    }
    report("last: ");
    return 0;
}

/* Create pools on the device until refused; then destroy one, create again, and trim an
 * invalid pool. */
static int mode_pools(void)
{
    setup();
    LOAD(lib, cuMemPoolCreate);
    LOAD(lib, cuMemPoolDestroy);
    LOAD(lib, cuMemPoolTrimTo);
    enum { MAX = 256 };
    static CUmemoryPool pools[MAX];
    CUmemPoolProps props;
    memset(&props, 0, sizeof props);
    props.allocType = CU_MEM_ALLOCATION_TYPE_PINNED;
    props.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    props.location.id = device;
    int n = 0;
    CUresult rc = CUDA_SUCCESS;
    while (n < MAX && (rc = p_cuMemPoolCreate(&pools[n], &props)) == CUDA_SUCCESS)
        n++;
    printf("created=%d rc=%d\n", n, (int)rc);
    CHECK(p_cuMemPoolDestroy(pools[--n]));
    printf("again_rc=%d\n", (int)p_cuMemPoolCreate(&pools[n++], &props));
    printf("trim_invalid_rc=%d\n", (int)p_cuMemPoolTrimTo(NULL, 0));
    while (n > 0)
        CHECK(p_cuMemPoolDestroy(pools[--n]));
    return 0;
}

/* ------------------------------------------------------------------------- duty -------- */

/* Nanoseconds this thread has spent runnable but waiting for a CPU (the second field of
 * /proc/thread-self/schedstat); 0 where the kernel does not say. A duty workload can lose at
 * most that much GPU time to a busy machine: only while it waits for a CPU can it fail to launch
 * when its budget (or, uncapped, its queue) allows. */
static uint64_t run_delay_ns(void)
{
    unsigned long long on_cpu = 0, waiting = 0;
    FILE *f = fopen("/proc/thread-self/schedstat", "r");
    if (f == NULL)
        return 0;
    if (fscanf(f, "%llu %llu", &on_cpu, &waiting) != 2)
        waiting = 0;
    fclose(f);
    return waiting;
}

static int mode_duty(int argc, char **argv)
{
    if (argc < 5)
        return 2;
    setup();
    LOAD(lib, cuModuleLoadData);
    LOAD(lib, cuModuleGetFunction);
    LOAD(lib, cuEventCreate);
    LOAD(lib, cuEventRecord);
    LOAD(lib, cuEventSynchronize);
    LOAD(lib, cuCtxSynchronize);
    LOAD(lib, cuStreamCreate);
    uint64_t ns = strtoull(argv[2], NULL, 0);
    double seconds = atof(argv[3]);
    int depth = atoi(argv[4]);
    const char *how = argc > 5 ? argv[5] : "kernel";
    CUmodule m;
    CUfunction f;
    CHECK(p_cuModuleLoadData(&m, sleep_kernel_ptx));
    CHECK(p_cuModuleGetFunction(&f, m, "simgpu_sleep_ns"));
    CUstream s;
    CHECK(p_cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
    void *params[] = {&ns};
    CUgraphExec exec = NULL;
    /* graph: one kernel node of NS; graph4: a chain of four of NS/4 each. */
    uint64_t quarter = ns / 4;
    void *quarter_params[] = {&quarter};
    if (strcmp(how, "graph") == 0 || strcmp(how, "graph4") == 0) {
        LOAD(lib, cuGraphCreate);
        LOAD(lib, cuGraphAddKernelNode_v2);
        LOAD(lib, cuGraphInstantiateWithFlags);
        bool four = strcmp(how, "graph4") == 0;
        CUgraph g;
        CUgraphNode node = NULL;
        CHECK(p_cuGraphCreate(&g, 0));
        CUDA_KERNEL_NODE_PARAMS_v2 kp;
        memset(&kp, 0, sizeof kp);
        kp.func = f;
        kp.gridDimX = kp.gridDimY = kp.gridDimZ = 1;
        kp.blockDimX = kp.blockDimY = kp.blockDimZ = 1;
        kp.kernelParams = four ? quarter_params : params;
        for (int i = 0; i < (four ? 4 : 1); i++) {
            CUgraphNode prev = node;
            CHECK(p_cuGraphAddKernelNode_v2(&node, g, prev != NULL ? &prev : NULL,
                                            prev != NULL ? 1 : 0, &kp));
        }
        CHECK(p_cuGraphInstantiateWithFlags(&exec, g, 0));
    }
    if (strcmp(how, "capture") == 0) {
        /* Capture 200 launches into a graph first (recorded, not run: not to be paced), then
         * launch plain kernels. */
        CUresult (*begin)(CUstream, unsigned int) =
            (CUresult(*)(CUstream, unsigned int))test_sym(lib, "cuStreamBeginCapture_v2");
        CUresult rc = begin(s, 0);
        printf("begin_capture_rc=%d\n", (int)rc);
        if (rc == CUDA_SUCCESS) {
            LOAD(lib, cuLaunchKernel);
            LOAD(lib, cuGraphDestroy);
            uint64_t t = test_now_ns();
            for (int i = 0; i < 200; i++)
                CHECK(p_cuLaunchKernel(f, 1, 1, 1, 1, 1, 1, 0, s, params, NULL));
            printf("capture_ns=%llu\n", (unsigned long long)(test_now_ns() - t));
            CUresult (*end_capture)(CUstream, CUgraph *) =
                (CUresult(*)(CUstream, CUgraph *))test_sym(lib, "cuStreamEndCapture");
            CUgraph g = NULL;
            CHECK(end_capture(s, &g));
            CHECK(p_cuGraphDestroy(g));
        }
    }
    enum { RING = 64 };
    CUevent ring[RING];
    for (int i = 0; i < RING; i++)
        CHECK(p_cuEventCreate(&ring[i], CU_EVENT_DISABLE_TIMING));
    if (depth > RING)
        depth = RING;
    uint64_t delay_before = run_delay_ns();
    uint64_t start = test_now_ns(), end = start + (uint64_t)(seconds * 1e9);
    uint64_t launched = 0;
    while (test_now_ns() < end) {
        if (launched >= (uint64_t)depth)
            CHECK(p_cuEventSynchronize(ring[(launched - (uint64_t)depth) % RING]));
        if (exec != NULL) {
            LOAD(lib, cuGraphLaunch);
            CHECK(p_cuGraphLaunch(exec, s));
        } else if (strcmp(how, "coop") == 0) {
            LOAD(lib, cuLaunchCooperativeKernel);
            CHECK(p_cuLaunchCooperativeKernel(f, 1, 1, 1, 1, 1, 1, 0, s, params));
        } else if (strcmp(how, "ex") == 0) {
            LOAD(lib, cuLaunchKernelEx);
            CUlaunchConfig cfg;
            memset(&cfg, 0, sizeof cfg);
            cfg.gridDimX = cfg.gridDimY = cfg.gridDimZ = 1;
            cfg.blockDimX = cfg.blockDimY = cfg.blockDimZ = 1;
            cfg.hStream = s;
            CHECK(p_cuLaunchKernelEx(&cfg, f, params, NULL));
        } else {
            LOAD(lib, cuLaunchKernel);
            CHECK(p_cuLaunchKernel(f, 1, 1, 1, 1, 1, 1, 0, s, params, NULL));
        }
        CHECK(p_cuEventRecord(ring[launched % RING], s));
        launched++;
    }
    CHECK(p_cuCtxSynchronize());
    uint64_t elapsed = test_now_ns() - start;
    uint64_t delay = run_delay_ns() - delay_before;
    printf("launched=%llu elapsed_ns=%llu share=%.2f start_ns=%llu end_ns=%llu "
           "run_delay_ns=%llu\n",
           (unsigned long long)launched, (unsigned long long)elapsed,
           100.0 * (double)(launched * ns) / (double)elapsed, (unsigned long long)start,
           (unsigned long long)(start + elapsed), (unsigned long long)delay);
    return 0;
}

/* ------------------------------------------------------------------------- latency ----- */

static int cmp_u64(const void *a, const void *b)
{
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? -1 : x > y;
}

/* What a latency-sensitive tenant (an inference server) sees: each kernel's time from the launch
 * call to its completion, with GAP_NS of host work between kernels. */
static int mode_latency(int argc, char **argv)
{
    if (argc < 5)
        return 2;
    setup();
    LOAD(lib, cuModuleLoadData);
    LOAD(lib, cuModuleGetFunction);
    LOAD(lib, cuLaunchKernel);
    LOAD(lib, cuStreamCreate);
    LOAD(lib, cuStreamSynchronize);
    uint64_t ns = strtoull(argv[2], NULL, 0);
    double seconds = atof(argv[3]);
    uint64_t gap = strtoull(argv[4], NULL, 0);
    CUmodule m;
    CUfunction f;
    CHECK(p_cuModuleLoadData(&m, sleep_kernel_ptx));
    CHECK(p_cuModuleGetFunction(&f, m, "simgpu_sleep_ns"));
    CUstream s;
    CHECK(p_cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
    void *params[] = {&ns};
    enum { MAX = 1 << 20 };
    uint64_t *lat = malloc(MAX * sizeof *lat);
    if (lat == NULL)
        return 1;
    size_t n = 0;
    uint64_t start = test_now_ns(), end = start + (uint64_t)(seconds * 1e9);
    while (test_now_ns() < end && n < MAX) {
        uint64_t t0 = test_now_ns();
        CHECK(p_cuLaunchKernel(f, 1, 1, 1, 1, 1, 1, 0, s, params, NULL));
        CHECK(p_cuStreamSynchronize(s));
        lat[n++] = test_now_ns() - t0;
        if (gap > 0) {
            struct timespec ts = {(time_t)(gap / 1000000000ULL), (long)(gap % 1000000000ULL)};
            nanosleep(&ts, NULL);
        }
    }
    uint64_t elapsed = test_now_ns() - start;
    if (n == 0)
        return 1;
    qsort(lat, n, sizeof *lat, cmp_u64);
    printf("elapsed_ns=%llu share=%.2f kernels=%zu p50_ns=%llu p90_ns=%llu p99_ns=%llu max_ns=%llu\n",
           (unsigned long long)elapsed, 100.0 * (double)(n * ns) / (double)elapsed, n,
           (unsigned long long)lat[n / 2], (unsigned long long)lat[n * 9 / 10],
           (unsigned long long)lat[n * 99 / 100], (unsigned long long)lat[n - 1]);
    free(lat);
    return 0;
}

/* ------------------------------------------------------------------------- bench ------- */

static int mode_bench(int argc, char **argv)
{
    int n = argc > 2 ? atoi(argv[2]) : 100000;
    setup();
    LOAD(lib, cuModuleLoadData);
    LOAD(lib, cuModuleGetFunction);
    LOAD(lib, cuLaunchKernel);
    LOAD(lib, cuMemAlloc_v2);
    LOAD(lib, cuMemFree_v2);
    LOAD(lib, cuCtxSynchronize);
    CUmodule m;
    CUfunction f;
    CHECK(p_cuModuleLoadData(&m, sleep_kernel_ptx));
    CHECK(p_cuModuleGetFunction(&f, m, "simgpu_sleep_ns"));
    uint64_t zero = 0;
    void *params[] = {&zero};
    /* Launches of an empty kernel, synchronised now and then so the queue stays short. */
    uint64_t best_launch = UINT64_MAX;
    for (int round = 0; round < 5; round++) {
        uint64_t t = test_now_ns();
        for (int i = 0; i < n / 5; i++)
            CHECK(p_cuLaunchKernel(f, 1, 1, 1, 1, 1, 1, 0, NULL, params, NULL));
        uint64_t per = (test_now_ns() - t) / (uint64_t)(n / 5);
        CHECK(p_cuCtxSynchronize());
        if (per < best_launch)
            best_launch = per;
    }
    /* Alloc/free pairs with 10 000 other allocations live. */
    enum { LIVE = 10000 };
    static CUdeviceptr live[LIVE];
    for (int i = 0; i < LIVE; i++)
        CHECK(p_cuMemAlloc_v2(&live[i], 512));
    uint64_t best_alloc = UINT64_MAX, best_free = UINT64_MAX;
    enum { BATCH = 1000 };
    static CUdeviceptr batch[BATCH];
    for (int round = 0; round < 5; round++) {
        uint64_t t0 = test_now_ns();
        for (int i = 0; i < BATCH; i++)
            CHECK(p_cuMemAlloc_v2(&batch[i], 4096));
        uint64_t t1 = test_now_ns();
        for (int i = 0; i < BATCH; i++)
            CHECK(p_cuMemFree_v2(batch[i]));
        uint64_t t2 = test_now_ns();
        if ((t1 - t0) / BATCH < best_alloc)
            best_alloc = (t1 - t0) / BATCH;
        if ((t2 - t1) / BATCH < best_free)
            best_free = (t2 - t1) / BATCH;
    }
    for (int i = 0; i < LIVE; i++)
        CHECK(p_cuMemFree_v2(live[i]));
    /* cuMemGetInfo_v2, what frameworks ask before and after every allocation: through the
     * library the program loaded (the shim, if preloaded) and straight from the driver behind
     * it (libcuda-real.so.1, which the shim loads; the same library without the shim), in
     * alternating rounds so that both see the same load. The simulated call itself costs
     * microseconds (it sweeps for dead processes each time), so the difference measured within
     * one process is what isolates the shim's part. */
    LOAD(lib, cuMemGetInfo_v2);
    void *real = dlopen("libcuda-real.so.1", RTLD_NOW | RTLD_NOLOAD);
    __typeof__(&cuMemGetInfo_v2) p_direct_info =
        real != NULL ? (__typeof__(&cuMemGetInfo_v2))test_sym(real, "cuMemGetInfo_v2")
                     : p_cuMemGetInfo_v2;
    uint64_t best_info = UINT64_MAX, best_direct = UINT64_MAX;
    enum { INFO_ROUNDS = 400 };
    for (int round = 0; round < INFO_ROUNDS; round++) {
        __typeof__(&cuMemGetInfo_v2) call = round % 2 ? p_direct_info : p_cuMemGetInfo_v2;
        size_t free_b = 0, total = 0;
        int calls = n / INFO_ROUNDS > 0 ? n / INFO_ROUNDS : 1;
        uint64_t t = test_now_ns();
        for (int i = 0; i < calls; i++)
            CHECK(call(&free_b, &total));
        uint64_t per = (test_now_ns() - t) / (uint64_t)calls;
        uint64_t *best = round % 2 ? &best_direct : &best_info;
        if (per < *best)
            *best = per;
    }
    /* Launches of a graph of one empty kernel node. */
    LOAD(lib, cuGraphCreate);
    LOAD(lib, cuGraphAddKernelNode_v2);
    LOAD(lib, cuGraphInstantiateWithFlags);
    LOAD(lib, cuGraphLaunch);
    CUgraph g;
    CUgraphNode node;
    CUgraphExec exec;
    CHECK(p_cuGraphCreate(&g, 0));
    CUDA_KERNEL_NODE_PARAMS_v2 kp;
    memset(&kp, 0, sizeof kp);
    kp.func = f;
    kp.gridDimX = kp.gridDimY = kp.gridDimZ = 1;
    kp.blockDimX = kp.blockDimY = kp.blockDimZ = 1;
    kp.kernelParams = params;
    CHECK(p_cuGraphAddKernelNode_v2(&node, g, NULL, 0, &kp));
    CHECK(p_cuGraphInstantiateWithFlags(&exec, g, 0));
    uint64_t best_graph = UINT64_MAX;
    for (int round = 0; round < 5; round++) {
        uint64_t t = test_now_ns();
        for (int i = 0; i < n / 5; i++)
            CHECK(p_cuGraphLaunch(exec, NULL));
        uint64_t per = (test_now_ns() - t) / (uint64_t)(n / 5);
        CHECK(p_cuCtxSynchronize());
        if (per < best_graph)
            best_graph = per;
    }
    printf("launch_ns=%llu alloc_ns=%llu free_ns=%llu info_ns=%llu info_direct_ns=%llu "
           "graph_ns=%llu\n",
           (unsigned long long)best_launch, (unsigned long long)best_alloc,
           (unsigned long long)best_free, (unsigned long long)best_info,
           (unsigned long long)best_direct, (unsigned long long)best_graph);
    return 0;
}

/* ------------------------------------------------------------------------- signals ----- */

static volatile sig_atomic_t delivered[NSIG];

static void count_signal(int sig, siginfo_t *info, void *uctx)
{
    (void)info;
    (void)uctx;
    delivered[sig]++;
}

static bool same_action(const struct sigaction *a, const struct sigaction *b)
{
    if (a->sa_flags != b->sa_flags)
        return false;
    if ((a->sa_flags & SA_SIGINFO) ? a->sa_sigaction != b->sa_sigaction
                                   : a->sa_handler != b->sa_handler)
        return false;
    for (int s = 1; s < NSIG; s++)
        if (sigismember(&a->sa_mask, s) != sigismember(&b->sa_mask, s))
            return false;
    return true;
}

/* Installs handlers, then initialises CUDA and allocates and launches (through the shim with
 * memory and cores limits), then checks that every signal's disposition and the thread's mask
 * are what they were, and that the handlers are still the ones delivered to. */
static int mode_signals(void)
{
    static const int mine[] = {SIGUSR1, SIGUSR2, SIGTERM, SIGCHLD};
    for (size_t i = 0; i < sizeof mine / sizeof mine[0]; i++) {
        struct sigaction sa;
        memset(&sa, 0, sizeof sa);
        sa.sa_sigaction = count_signal;
        sa.sa_flags = SA_SIGINFO | SA_RESTART;
        sigemptyset(&sa.sa_mask);
        sigaddset(&sa.sa_mask, SIGUSR1 + (int)i % 2); /* a distinct mask to compare */
        if (sigaction(mine[i], &sa, NULL) != 0)
            return 3;
    }
    static struct sigaction before[NSIG];
    static bool known[NSIG];
    for (int s = 1; s < NSIG; s++)
        known[s] = sigaction(s, NULL, &before[s]) == 0;
    sigset_t mask_before, mask_after;
    pthread_sigmask(SIG_SETMASK, NULL, &mask_before);

    setup();
    LOAD(lib, cuModuleLoadData);
    LOAD(lib, cuModuleGetFunction);
    LOAD(lib, cuLaunchKernel);
    LOAD(lib, cuMemAlloc_v2);
    LOAD(lib, cuMemFree_v2);
    LOAD(lib, cuMemAllocAsync);
    LOAD(lib, cuMemFreeAsync);
    LOAD(lib, cuMemGetInfo_v2);
    LOAD(lib, cuCtxSynchronize);
    CUmodule m;
    CUfunction f;
    CHECK(p_cuModuleLoadData(&m, sleep_kernel_ptx));
    CHECK(p_cuModuleGetFunction(&f, m, "simgpu_sleep_ns"));
    uint64_t ns = 200000;
    void *params[] = {&ns};
    for (int i = 0; i < 40; i++) {
        CUdeviceptr a, b;
        CHECK(p_cuMemAlloc_v2(&a, 1 << 20));
        CHECK(p_cuMemAllocAsync(&b, 1 << 20, NULL));
        CHECK(p_cuLaunchKernel(f, 1, 1, 1, 1, 1, 1, 0, NULL, params, NULL));
        CHECK(p_cuMemFreeAsync(b, NULL));
        CHECK(p_cuMemFree_v2(a));
    }
    CUdeviceptr big;
    printf("refused_rc=%d\n", (int)p_cuMemAlloc_v2(&big, (size_t)1 << 40));
    size_t free_b, total;
    CHECK(p_cuMemGetInfo_v2(&free_b, &total));
    CHECK(p_cuCtxSynchronize());

    int changed = 0;
    for (int s = 1; s < NSIG; s++) {
        struct sigaction now;
        bool ok = sigaction(s, NULL, &now) == 0;
        if (ok != known[s] || (ok && !same_action(&before[s], &now))) {
            printf("changed_signal=%d\n", s);
            changed++;
        }
    }
    pthread_sigmask(SIG_SETMASK, NULL, &mask_after);
    int mask_changed = 0;
    for (int s = 1; s < NSIG; s++)
        mask_changed += sigismember(&mask_before, s) != sigismember(&mask_after, s);
    struct sigaction segv, bus;
    sigaction(SIGSEGV, NULL, &segv);
    sigaction(SIGBUS, NULL, &bus);

    /* Delivery: raised in the process, and SIGCHLD from a real child. */
    raise(SIGUSR1);
    raise(SIGUSR2);
    raise(SIGTERM);
    pid_t child = fork();
    if (child == 0)
        _exit(0);
    int status;
    while (waitpid(child, &status, 0) < 0 && errno == EINTR)
        ;
    /* Due at once (the child has been reaped); up to 10 s for a thread the machine is slow to
     * run again. */
    for (int i = 0; i < 10000 && delivered[SIGCHLD] == 0; i++)
        usleep(1000);
    printf("changed=%d mask_changed=%d segv_default=%d bus_default=%d\n", changed, mask_changed,
           segv.sa_handler == SIG_DFL, bus.sa_handler == SIG_DFL);
    printf("usr1=%d usr2=%d term=%d chld=%d\n", (int)delivered[SIGUSR1], (int)delivered[SIGUSR2],
           (int)delivered[SIGTERM], (int)delivered[SIGCHLD]);
    return 0;
}

int main(int argc, char **argv)
{
    setvbuf(stdout, NULL, _IOLBF, 0);
    if (argc < 2) {
        fprintf(stderr, "usage: see the comment at the top of shim_probe.c\n");
        return 2;
    }
    lib = test_open("TEST_LIBCUDA", "libcuda.so.1");
    const char *d = getenv("PROBE_DEVICE");
    device = d != NULL ? atoi(d) : 0;
    const char *mode = argv[1];
    if (strcmp(mode, "info") == 0) {
        setup();
        report("");
        return 0;
    }
    if (strcmp(mode, "alloc") == 0)
        return mode_alloc(argc, argv);
    if (strcmp(mode, "devices") == 0)
        return mode_devices();
    if (strcmp(mode, "race") == 0)
        return mode_race(argc, argv);
    if (strcmp(mode, "loop") == 0)
        return mode_loop();
    if (strcmp(mode, "fork") == 0)
        return mode_fork(argc, argv);
    if (strcmp(mode, "caching") == 0)
        return mode_caching(argc, argv);
    if (strcmp(mode, "duty") == 0)
        return mode_duty(argc, argv);
    if (strcmp(mode, "latency") == 0)
        return mode_latency(argc, argv);
    if (strcmp(mode, "poolcache") == 0)
        return mode_poolcache(argc, argv);
    if (strcmp(mode, "pools") == 0)
        return mode_pools();
    if (strcmp(mode, "poolgrowth") == 0)
        return mode_poolgrowth(argc, argv);
    if (strcmp(mode, "pooldestroy") == 0)
        return mode_pooldestroy(argc, argv);
    if (strcmp(mode, "bench") == 0)
        return mode_bench(argc, argv);
    if (strcmp(mode, "graph_mem") == 0)
        return mode_graph_mem(argc, argv);
    if (strcmp(mode, "signals") == 0)
        return mode_signals();
    fprintf(stderr, "unknown mode %s\n", mode);
    return 2;
}
