/*
 * One process of a claim (and, on request, a forked child of it) driven line by line, to check
 * that what a process holds stays counted in the usage region whatever else that process does
 * with the region: its NVML half sweeping for dead processes, another descriptor of the region
 * file opened and closed, a fork. Reaches both halves the way applications do (dlopen of
 * libcuda.so.1 and libnvidia-ml.so.1), so it runs unchanged against a real GPU.
 *
 * Commands, one per line on stdin; each is answered by one line of key=value pairs on stdout:
 *
 *   procaddr          cuGetProcAddress_v2 without cuInit (the shim initialises, as when a
 *                     binding resolves its entry points at import)      -> rc=N
 *   cuda              cuInit and the primary context of $PROBE_DEVICE made current -> rc=N
 *   alloc BYTES       cuMemAlloc_v2, kept until exit                    -> rc=N
 *   nvml N GAP_MS     nvmlDeviceGetMemoryInfo and _v2, N readings each, GAP_MS apart
 *                                                                       -> used=A,B.. used_v2=A,B..
 *   touch             open the usage region file ($TESSERA_USAGE_REGION) and close it -> rc=0
 *   reuse             close every descriptor of the usage region (the shim's own included, as a
 *                     daemon closing all does) and open scratch files read-write under the same
 *                     numbers                                           -> closed=N
 *   fork [starved]    fork; the child serves "child CMD" lines, its answers on the same stdout,
 *                     and exits when its parent does (unless paused). starved: with no
 *                     descriptor free while the fork handlers run      -> pid=CHILD
 *   child CMD         CMD in the child (whose answer is the reply)
 *   pause             stop serving and wait to be killed                -> paused=1
 *   exec              exec this program anew (same pid, same stdin)     -> ready pid=N
 */
#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdbool.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include "simgpu_test.h"

static void *cuda_lib;
static void *nvml_lib;
static int to_child = -1; /* the child's command pipe (parent side) */

static void answer(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

static void answer(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vprintf(fmt, ap);
    va_end(ap);
    putchar('\n');
    fflush(stdout);
}

/* One line from `fd`, read a byte at a time so that nothing is buffered past it (a forked child
 * must not inherit commands meant for its parent). False at end of input. */
static bool read_command(int fd, char *line, size_t size)
{
    size_t n = 0;
    for (;;) {
        char c;
        ssize_t got = read(fd, &c, 1);
        if (got < 0 && errno == EINTR)
            continue;
        if (got <= 0) {
            line[n] = '\0';
            return n > 0;
        }
        if (c == '\n') {
            line[n] = '\0';
            return true;
        }
        if (n + 1 < size)
            line[n++] = c;
    }
}

static int start_cuda(void)
{
    LOAD(cuda_lib, cuInit);
    LOAD(cuda_lib, cuDevicePrimaryCtxRetain);
    LOAD(cuda_lib, cuCtxSetCurrent);
    const char *dev = getenv("PROBE_DEVICE");
    CUresult rc = p_cuInit(0);
    CUcontext ctx = NULL;
    if (rc == CUDA_SUCCESS)
        rc = p_cuDevicePrimaryCtxRetain(&ctx, dev != NULL ? atoi(dev) : 0);
    if (rc == CUDA_SUCCESS)
        rc = p_cuCtxSetCurrent(ctx);
    return (int)rc;
}

static void nvml_readings(int count, int gap_ms)
{
    LOAD(nvml_lib, nvmlInit_v2);
    LOAD(nvml_lib, nvmlDeviceGetHandleByIndex_v2);
    LOAD(nvml_lib, nvmlDeviceGetMemoryInfo);
    LOAD(nvml_lib, nvmlDeviceGetMemoryInfo_v2);
    nvmlDevice_t device = NULL;
    const char *dev = getenv("PROBE_DEVICE");
    if (p_nvmlInit_v2() != NVML_SUCCESS ||
        p_nvmlDeviceGetHandleByIndex_v2(dev != NULL ? (unsigned)atoi(dev) : 0, &device) !=
            NVML_SUCCESS) {
        answer("nvml_rc=failed");
        return;
    }
    char v1[1024] = "", v2[1024] = "";
    size_t n1 = 0, n2 = 0;
    for (int i = 0; i < count; i++) {
        if (i > 0) {
            struct timespec gap = {gap_ms / 1000, (long)(gap_ms % 1000) * 1000000L};
            nanosleep(&gap, NULL);
        }
        nvmlMemory_t m1;
        nvmlMemory_v2_t m2 = {.version = nvmlMemory_v2};
        long long u1 = p_nvmlDeviceGetMemoryInfo(device, &m1) == NVML_SUCCESS ? (long long)m1.used : -1;
        long long u2 =
            p_nvmlDeviceGetMemoryInfo_v2(device, &m2) == NVML_SUCCESS ? (long long)m2.used : -1;
        n1 += (size_t)snprintf(v1 + n1, sizeof v1 - n1, "%s%lld", i ? "," : "", u1);
        n2 += (size_t)snprintf(v2 + n2, sizeof v2 - n2, "%s%lld", i ? "," : "", u2);
    }
    answer("used=%s used_v2=%s", v1, v2);
}

/* Close the descriptors naming the usage region file and give each number to a new read-write
 * scratch file (unlinked at once). Returns how many there were. */
static int reuse_region_descriptors(void)
{
    const char *region = getenv("TESSERA_USAGE_REGION");
    struct stat want;
    if (region == NULL || stat(region, &want) != 0)
        return -1;
    int closed = 0;
    for (int fd = 3; fd < 1024; fd++) {
        struct stat st;
        if (fstat(fd, &st) != 0 || st.st_dev != want.st_dev || st.st_ino != want.st_ino)
            continue;
        char scratch[] = "/tmp/shim_slots.XXXXXX";
        int other = mkostemp(scratch, O_CLOEXEC);
        if (other < 0)
            return -1;
        unlink(scratch);
        if (dup3(other, fd, O_CLOEXEC) < 0) /* closes the region's descriptor, takes its number */
            return -1;
        close(other);
        closed++;
    }
    return closed;
}

static void serve(int in);

/* Take every descriptor the soft limit (lowered to FILL) leaves, so that nothing run at the
 * fork can open a file; fill_end gives them back and restores the limit. */
#define FILL 64
static int filled[FILL];
static int nfilled;
static struct rlimit saved_limit;

static void fill_descriptors(void)
{
    getrlimit(RLIMIT_NOFILE, &saved_limit);
    struct rlimit tight = saved_limit;
    tight.rlim_cur = FILL;
    setrlimit(RLIMIT_NOFILE, &tight);
    for (nfilled = 0; nfilled < FILL && (filled[nfilled] = dup(0)) >= 0; nfilled++)
        ;
}

static void fill_end(void)
{
    while (nfilled > 0)
        close(filled[--nfilled]);
    setrlimit(RLIMIT_NOFILE, &saved_limit);
}

static void do_fork(bool starved)
{
    int p[2];
    if (pipe(p) != 0) {
        answer("pid=-1");
        return;
    }
    fflush(stdout);
    if (starved)
        fill_descriptors();
    pid_t pid = fork();
    if (starved)
        fill_end();
    if (pid == 0) {
        close(p[1]);
        to_child = -1;
        serve(p[0]);
        exit(0);
    }
    close(p[0]);
    to_child = p[1];
    answer("pid=%d", (int)pid);
}

static void run_command(char *line)
{
    char *arg = strchr(line, ' ');
    if (arg != NULL)
        *arg++ = '\0';
    if (strcmp(line, "procaddr") == 0) {
        LOAD(cuda_lib, cuGetProcAddress_v2);
        void *fn = NULL;
        CUdriverProcAddressQueryResult found;
        answer("rc=%d", (int)p_cuGetProcAddress_v2("cuMemAlloc", &fn, 12000,
                                                   CU_GET_PROC_ADDRESS_DEFAULT, &found));
    } else if (strcmp(line, "cuda") == 0) {
        answer("rc=%d", start_cuda());
    } else if (strcmp(line, "alloc") == 0 && arg != NULL) {
        LOAD(cuda_lib, cuMemAlloc_v2);
        CUdeviceptr ptr = 0;
        answer("rc=%d", (int)p_cuMemAlloc_v2(&ptr, strtoull(arg, NULL, 0)));
    } else if (strcmp(line, "nvml") == 0 && arg != NULL) {
        int count = 0, gap_ms = 0;
        if (sscanf(arg, "%d %d", &count, &gap_ms) != 2 || count < 1 || count > 32)
            answer("nvml_rc=bad_arguments");
        else
            nvml_readings(count, gap_ms);
    } else if (strcmp(line, "touch") == 0) {
        const char *path = getenv("TESSERA_USAGE_REGION");
        int fd = path != NULL ? open(path, O_RDONLY | O_CLOEXEC) : -1;
        answer("rc=%d", fd >= 0 && close(fd) == 0 ? 0 : -1);
    } else if (strcmp(line, "reuse") == 0) {
        answer("closed=%d", reuse_region_descriptors());
    } else if (strcmp(line, "fork") == 0) {
        do_fork(arg != NULL && strcmp(arg, "starved") == 0);
    } else if (strcmp(line, "child") == 0 && arg != NULL && to_child >= 0) {
        size_t len = strlen(arg);
        arg[len] = '\n';
        if (write(to_child, arg, len + 1) != (ssize_t)(len + 1))
            answer("child_rc=unreachable");
    } else if (strcmp(line, "exec") == 0) {
        fflush(stdout);
        execl("/proc/self/exe", "shim_slots", (char *)NULL);
        answer("exec_errno=%d", errno);
    } else if (strcmp(line, "pause") == 0) {
        answer("paused=1");
        for (;;)
            pause();
    } else {
        answer("unknown=%s", line);
    }
}

static void serve(int in)
{
    char line[512];
    while (read_command(in, line, sizeof line))
        run_command(line);
}

int main(void)
{
    cuda_lib = test_open("TEST_LIBCUDA", "libcuda.so.1");
    nvml_lib = test_open("TEST_LIBNVML", "libnvidia-ml.so.1");
    answer("ready pid=%d", (int)getpid());
    serve(0);
    return 0;
}
