/*
 * Workload probes the pytest suite drives as separate processes (several at once for the
 * cross-process tests). Each prints machine-readable lines on stdout.
 *
 *   simgpu_probe alloc DEVICE CHUNK_BYTES COUNT
 *       allocate COUNT chunks, print "alloc I RESULT" for each, then "holding", and keep the
 *       memory until stdin closes (or the process is killed).
 *   simgpu_probe duty DEVICE PERCENT PERIOD_MS DURATION_MS
 *       keep the GPU busy PERCENT % of each period with simgpu_sleep_ns kernels; print
 *       "origin_uncertainty_ns U", each kernel's device interval "interval START_NS END_NS"
 *       (CLOCK_MONOTONIC, from CUDA events, to within U: how well the host time of the first
 *       event is known) and "done".
 *   simgpu_probe wait-lost DEVICE
 *       work until the GPU stops answering (an allocation and a synchronisation, then a 20 ms
 *       sleep, per round; a round whose allocation passed but whose synchronisation failed saw
 *       the change between its calls and is not the answer); print "lost ALLOC_RESULT SYNC_RESULT", then "rounds_after_change N":
 *       how many rounds began after the probe itself saw $SIMGPU_CONFIG change (inode, size or
 *       mtime; counted from its latest change), the last of them the one that failed; 0 if the
 *       driver saw the change first.
 *   simgpu_probe latency ITERATIONS
 *       print "min_ns N" and "mean_ns N": the shortest and the mean duration of one
 *       cuDeviceGetCount.
 *   simgpu_probe call-cost ITERATIONS
 *       print "ctx_get_current_ns N" and "launch_ns N", the mean duration of cuCtxGetCurrent
 *       and of launching a zero-length simgpu_sleep_ns kernel (the per-call overhead; a
 *       benchmark figure, benchmarks/simgpu/call_cost.py).
 *   simgpu_probe call-syscalls ITERATIONS
 *       in a child it traces (ptrace), make ITERATIONS calls of cuCtxGetCurrent, then ITERATIONS
 *       zero-length launches; print, per phase, "PHASE_syscalls N", "PHASE_stats N" (system
 *       calls of the stat family among them) and "PHASE_ns N" (the phase's duration), for
 *       PHASE ctx_get_current and launch. Exit status 4 if the system refuses tracing.
 */
#include <signal.h>
#include <stdbool.h>
#include <sys/ptrace.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include "simgpu_test.h"

static void *cuda;

#define CHECK(call)                                                                               \
    do {                                                                                          \
        CUresult rc_ = (call);                                                                    \
        if (rc_ != CUDA_SUCCESS) {                                                                \
            fprintf(stderr, "%s failed: %d\n", #call, (int)rc_);                                  \
            exit(1);                                                                              \
        }                                                                                         \
    } while (0)

static CUcontext use_device(int ordinal)
{
    LOAD(cuda, cuInit);
    LOAD(cuda, cuDeviceGet);
    LOAD(cuda, cuDevicePrimaryCtxRetain);
    LOAD(cuda, cuCtxSetCurrent);
    CUdevice dev = 0;
    CUcontext ctx = NULL;
    CHECK(p_cuInit(0));
    CHECK(p_cuDeviceGet(&dev, ordinal));
    CHECK(p_cuDevicePrimaryCtxRetain(&ctx, dev));
    CHECK(p_cuCtxSetCurrent(ctx));
    return ctx;
}

static int alloc_hold(int device, size_t chunk, int count)
{
    LOAD(cuda, cuMemAlloc_v2);
    LOAD(cuda, cuMemFree_v2);
    use_device(device);
    CUdeviceptr *ptrs = calloc((size_t)count, sizeof *ptrs);
    for (int i = 0; i < count; i++) {
        CUresult rc = p_cuMemAlloc_v2(&ptrs[i], chunk);
        printf("alloc %d %d\n", i, (int)rc);
        if (rc != CUDA_SUCCESS)
            ptrs[i] = 0;
    }
    printf("holding\n");
    fflush(stdout);
    while (getchar() != EOF) {
    }
    for (int i = 0; i < count; i++) {
        if (ptrs[i] != 0)
            CHECK(p_cuMemFree_v2(ptrs[i]));
    }
    free(ptrs);
    return 0;
}

static void sleep_until_ns(uint64_t t)
{
    struct timespec ts = {.tv_sec = (time_t)(t / 1000000000ULL),
                          .tv_nsec = (long)(t % 1000000000ULL)};
    while (clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &ts, NULL) != 0) {
    }
}

static int duty(int device, int percent, int period_ms, int duration_ms)
{
    LOAD(cuda, cuModuleLoadData);
    LOAD(cuda, cuModuleGetFunction);
    LOAD(cuda, cuLaunchKernel);
    LOAD(cuda, cuEventCreate);
    LOAD(cuda, cuEventRecord);
    LOAD(cuda, cuEventElapsedTime);
    LOAD(cuda, cuCtxSynchronize);
    use_device(device);
    CUmodule module = NULL;
    CUfunction sleep_fn = NULL;
    CHECK(p_cuModuleLoadData(&module, sleep_kernel_ptx));
    CHECK(p_cuModuleGetFunction(&sleep_fn, module, "simgpu_sleep_ns"));
    uint64_t period = (uint64_t)period_ms * 1000000ULL;
    uint64_t busy = period * (uint64_t)percent / 100;
    int kernels = duration_ms / period_ms;
    /* At 100 % each kernel is queued half a period early so the GPU never idles between. */
    uint64_t lead = percent >= 100 ? period / 2 : 0;
    CUevent origin = NULL;
    CUevent *starts = calloc((size_t)kernels, sizeof *starts);
    CUevent *ends = calloc((size_t)kernels, sizeof *ends);
    CHECK(p_cuEventCreate(&origin, CU_EVENT_DEFAULT));
    for (int k = 0; k < kernels; k++) {
        CHECK(p_cuEventCreate(&starts[k], CU_EVENT_DEFAULT));
        CHECK(p_cuEventCreate(&ends[k], CU_EVENT_DEFAULT));
    }
    /* The origin event, recorded on the idle stream, carries the time of the record call: a
     * moment between two host clock readings around it, whose middle is taken as its host time.
     * A thread descheduled in between widens that bracket, so the event is recorded again (up
     * to 100 times) until half the bracket is under 10 us; what is left is reported. */
    uint64_t t0 = 0, uncertainty = 0;
    for (int i = 0; i < 100; i++) {
        uint64_t before = test_now_ns();
        CHECK(p_cuEventRecord(origin, NULL));
        uint64_t after = test_now_ns();
        uncertainty = (after - before) / 2;
        t0 = before + uncertainty;
        if (uncertainty < 10000)
            break;
    }
    printf("origin_uncertainty_ns %llu\n", (unsigned long long)uncertainty);
    for (int k = 0; k < kernels; k++) {
        uint64_t at = t0 + (uint64_t)k * period;
        sleep_until_ns(k > 0 ? at - lead : at);
        void *params[] = {&busy};
        CHECK(p_cuEventRecord(starts[k], NULL));
        CHECK(p_cuLaunchKernel(sleep_fn, 1, 1, 1, 1, 1, 1, 0, NULL, params, NULL));
        CHECK(p_cuEventRecord(ends[k], NULL));
    }
    CHECK(p_cuCtxSynchronize());
    for (int k = 0; k < kernels; k++) {
        float s = 0, e = 0;
        CHECK(p_cuEventElapsedTime(&s, origin, starts[k]));
        CHECK(p_cuEventElapsedTime(&e, origin, ends[k]));
        printf("interval %llu %llu\n", (unsigned long long)(t0 + (uint64_t)((double)s * 1e6)),
               (unsigned long long)(t0 + (uint64_t)((double)e * 1e6)));
    }
    printf("done\n");
    return 0;
}

static bool same_file(const struct stat *a, const struct stat *b)
{
    return a->st_ino == b->st_ino && a->st_dev == b->st_dev && a->st_size == b->st_size &&
           a->st_mtim.tv_sec == b->st_mtim.tv_sec && a->st_mtim.tv_nsec == b->st_mtim.tv_nsec;
}

static int wait_lost(int device)
{
    LOAD(cuda, cuMemAlloc_v2);
    LOAD(cuda, cuMemFree_v2);
    LOAD(cuda, cuCtxSynchronize);
    const char *config = getenv("SIMGPU_CONFIG");
    struct stat seen, now;
    if (config == NULL || stat(config, &seen) != 0) {
        fprintf(stderr, "wait-lost needs a readable $SIMGPU_CONFIG\n");
        return 2;
    }
    use_device(device);
    printf("ready\n");
    fflush(stdout);
    /* Rounds begun since this process itself saw the file change: the driver's own check
     * cannot see the change earlier than that, so the count bounds how many calls it let pass. */
    int rounds = 0;
    for (;;) {
        if (stat(config, &now) == 0 && !same_file(&now, &seen)) {
            seen = now;
            rounds = 0;
        }
        rounds++;
        CUdeviceptr p = 0;
        CUresult alloc = p_cuMemAlloc_v2(&p, 1 << 20);
        CUresult sync = p_cuCtxSynchronize();
        if (alloc == CUDA_SUCCESS && sync != CUDA_SUCCESS) {
            /* The driver saw the change between the two calls: the allocation was made before it
             * knew. The next round must fail whole. */
            usleep(20000);
            continue;
        }
        if (alloc != CUDA_SUCCESS || sync != CUDA_SUCCESS) {
            /* A change the driver saw before this process did (it came between the stat above
             * and the calls) counts as seen at once. */
            if (stat(config, &now) == 0 && !same_file(&now, &seen))
                rounds = 0;
            printf("lost %d %d\n", (int)alloc, (int)sync);
            printf("rounds_after_change %d\n", rounds);
            return 0;
        }
        CHECK(p_cuMemFree_v2(p));
        usleep(20000);
    }
}

static int latency(int iterations)
{
    LOAD(cuda, cuInit);
    LOAD(cuda, cuDeviceGetCount);
    int count = 0;
    CHECK(p_cuInit(0));
    /* The shortest call is what the driver adds to every call: a call the scheduler interrupted
     * only takes longer, so one uninterrupted call among ITERATIONS is enough. */
    uint64_t start = test_now_ns(), shortest = UINT64_MAX;
    for (int i = 0; i < iterations; i++) {
        uint64_t t = test_now_ns();
        CHECK(p_cuDeviceGetCount(&count));
        uint64_t took = test_now_ns() - t;
        if (took < shortest)
            shortest = took;
    }
    printf("min_ns %llu\n", (unsigned long long)shortest);
    printf("mean_ns %llu\n", (unsigned long long)((test_now_ns() - start) / (uint64_t)iterations));
    return 0;
}

static int call_cost(int iterations)
{
    LOAD(cuda, cuCtxGetCurrent);
    LOAD(cuda, cuModuleLoadData);
    LOAD(cuda, cuModuleGetFunction);
    LOAD(cuda, cuLaunchKernel);
    LOAD(cuda, cuCtxSynchronize);
    use_device(0);
    CUmodule module = NULL;
    CUfunction sleep_fn = NULL;
    CHECK(p_cuModuleLoadData(&module, sleep_kernel_ptx));
    CHECK(p_cuModuleGetFunction(&sleep_fn, module, "simgpu_sleep_ns"));
    CUcontext ctx = NULL;
    uint64_t start = test_now_ns();
    for (int i = 0; i < iterations; i++)
        CHECK(p_cuCtxGetCurrent(&ctx));
    printf("ctx_get_current_ns %llu\n",
           (unsigned long long)((test_now_ns() - start) / (uint64_t)iterations));
    uint64_t zero = 0;
    void *params[] = {&zero};
    start = test_now_ns();
    for (int i = 0; i < iterations; i++)
        CHECK(p_cuLaunchKernel(sleep_fn, 1, 1, 1, 1, 1, 1, 0, NULL, params, NULL));
    printf("launch_ns %llu\n",
           (unsigned long long)((test_now_ns() - start) / (uint64_t)iterations));
    CHECK(p_cuCtxSynchronize());
    return 0;
}

/* The child of call-syscalls: the calls whose system calls are counted, in two phases marked
 * by getppid() (which the tracer does not count), each timed on the host clock. */
static void traced_calls(int iterations)
{
    LOAD(cuda, cuCtxGetCurrent);
    LOAD(cuda, cuModuleLoadData);
    LOAD(cuda, cuModuleGetFunction);
    LOAD(cuda, cuLaunchKernel);
    LOAD(cuda, cuCtxSynchronize);
    use_device(0);
    CUmodule module = NULL;
    CUfunction sleep_fn = NULL;
    CHECK(p_cuModuleLoadData(&module, sleep_kernel_ptx));
    CHECK(p_cuModuleGetFunction(&sleep_fn, module, "simgpu_sleep_ns"));
    CUcontext ctx = NULL;
    uint64_t zero = 0;
    void *params[] = {&zero};
    syscall(SYS_getppid);
    uint64_t start = test_now_ns();
    for (int i = 0; i < iterations; i++)
        CHECK(p_cuCtxGetCurrent(&ctx));
    uint64_t ctx_ns = test_now_ns() - start;
    syscall(SYS_getppid);
    start = test_now_ns();
    for (int i = 0; i < iterations; i++)
        CHECK(p_cuLaunchKernel(sleep_fn, 1, 1, 1, 1, 1, 1, 0, NULL, params, NULL));
    uint64_t launch_ns = test_now_ns() - start;
    syscall(SYS_getppid);
    CHECK(p_cuCtxSynchronize());
    printf("ctx_get_current_ns %llu\nlaunch_ns %llu\n", (unsigned long long)ctx_ns,
           (unsigned long long)launch_ns);
}

static bool stat_family(uint64_t nr)
{
    switch (nr) {
#ifdef SYS_stat
    case SYS_stat:
#endif
#ifdef SYS_lstat
    case SYS_lstat:
#endif
#ifdef SYS_newfstatat
    case SYS_newfstatat:
#endif
#ifdef SYS_statx
    case SYS_statx:
#endif
    case SYS_fstat:
        return true;
    default:
        return false;
    }
}

/* Count the system calls a traced child makes in each phase of traced_calls(). A count, unlike
 * a duration, does not change with the machine's load. */
static int call_syscalls(int iterations)
{
    fflush(stdout);
    pid_t child = fork();
    if (child < 0)
        return 1;
    if (child == 0) {
        if (ptrace(PTRACE_TRACEME, 0, NULL, NULL) != 0) {
            perror("ptrace(PTRACE_TRACEME)");
            _exit(4);
        }
        raise(SIGSTOP);
        traced_calls(iterations);
        fflush(stdout);
        _exit(0);
    }
    int status = 0;
    if (waitpid(child, &status, 0) != child || !WIFSTOPPED(status))
        return WIFEXITED(status) ? WEXITSTATUS(status) : 1;
    long options = PTRACE_O_TRACESYSGOOD | PTRACE_O_EXITKILL | PTRACE_O_TRACECLONE;
    if (ptrace(PTRACE_SETOPTIONS, child, NULL, (void *)options) != 0) {
        perror("ptrace(PTRACE_SETOPTIONS)");
        kill(child, SIGKILL);
        return 4;
    }
    /* Phase 0: set-up; 1: cuCtxGetCurrent; 2: launches; 3: the rest. */
    unsigned long long syscalls[4] = {0}, stats[4] = {0};
    int phase = 0;
    ptrace(PTRACE_SYSCALL, child, NULL, NULL);
    for (;;) {
        pid_t who = waitpid(-1, &status, __WALL);
        if (who < 0)
            break;
        if (WIFEXITED(status) || WIFSIGNALED(status)) {
            if (who == child)
                break;
            continue;
        }
        int deliver = 0;
        if (WSTOPSIG(status) == (SIGTRAP | 0x80)) {
            struct __ptrace_syscall_info info;
            if (ptrace(PTRACE_GET_SYSCALL_INFO, who, (void *)sizeof info, &info) > 0 &&
                info.op == PTRACE_SYSCALL_INFO_ENTRY) {
                if (info.entry.nr == SYS_getppid) {
                    if (phase < 3)
                        phase++;
                } else {
                    syscalls[phase]++;
                    stats[phase] += stat_family(info.entry.nr);
                }
            }
        } else if (status >> 16 == 0 && WSTOPSIG(status) != SIGSTOP) {
            deliver = WSTOPSIG(status); /* a real signal: pass it on */
        }
        ptrace(PTRACE_SYSCALL, who, NULL, (void *)(long)deliver);
    }
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0)
        return 1;
    printf("ctx_get_current_syscalls %llu\nctx_get_current_stats %llu\n", syscalls[1], stats[1]);
    printf("launch_syscalls %llu\nlaunch_stats %llu\n", syscalls[2], stats[2]);
    return 0;
}

int main(int argc, char **argv)
{
    setvbuf(stdout, NULL, _IOLBF, 0);
    cuda = test_open("TEST_LIBCUDA", "libcuda.so.1");
    if (argc == 5 && strcmp(argv[1], "alloc") == 0)
        return alloc_hold(atoi(argv[2]), strtoull(argv[3], NULL, 0), atoi(argv[4]));
    if (argc == 6 && strcmp(argv[1], "duty") == 0)
        return duty(atoi(argv[2]), atoi(argv[3]), atoi(argv[4]), atoi(argv[5]));
    if (argc == 3 && strcmp(argv[1], "wait-lost") == 0)
        return wait_lost(atoi(argv[2]));
    if (argc == 3 && strcmp(argv[1], "latency") == 0)
        return latency(atoi(argv[2]));
    if (argc == 3 && strcmp(argv[1], "call-cost") == 0)
        return call_cost(atoi(argv[2]));
    if (argc == 3 && strcmp(argv[1], "call-syscalls") == 0)
        return call_syscalls(atoi(argv[2]));
    fprintf(stderr, "usage: see the comment at the top of simgpu_probe.c\n");
    return 2;
}
