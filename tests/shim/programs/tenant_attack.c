/*
 * What a hostile tenant runs inside its own GPU container (tests/e2e/test_tenant_attacks.py): a
 * greedy allocator that takes every byte the GPU will give it, a well-behaved neighbour that keeps
 * re-allocating its whole claim, and the file tricks a container can play on what the node daemon
 * reads. It reaches libcuda as applications do (dlopen of "libcuda.so.1", or $TEST_LIBCUDA), so
 * the preloaded shim decides what it gets. One mode per invocation; results are "key=value" lines.
 *
 *   tenant_attack grab DEVICE CHUNK SECONDS   for SECONDS, try to allocate CHUNK bytes on CUDA
 *                                             device DEVICE every 2 ms and keep every allocation
 *                                             that succeeds (memory a neighbour frees is taken
 *                                             within milliseconds); then report what it held
 *   tenant_attack neighbour BYTES HOLD_MS GAP_MS   forever: allocate BYTES, hold them HOLD_MS,
 *                                             free, wait GAP_MS; one line per round
 *   tenant_attack limits PATH UUID BYTES CORES   write a limits file naming UUID, mode 0444
 *   tenant_attack region truncate|grow|scribble|zero PATH   cut the file to 0 bytes, extend it
 *                                             by 64 MiB, overwrite every byte with garbage, or zero
 *                                             every process's charge (a well-formed region that
 *                                             says the claim holds nothing)
 *   tenant_attack rename FROM TO              rename(2) FROM to TO, nothing else (mv copies and
 *                                             deletes where a rename fails across filesystems);
 *                                             reports renamed=0, or renamed=1 and the errno name
 *   tenant_attack link TARGET LINK            make TARGET's folders in this container and the
 *                                             symlink LINK -> TARGET (absolute links are resolved
 *                                             against the root of whoever follows them)
 */
#include <errno.h>
#include <fcntl.h>
#include <stddef.h>
#include <sys/stat.h>
#include <unistd.h>

#include "simgpu_test.h"
#include "tessera_shim.h"

static void *lib;

#define CHECK(call)                                                                               \
    do {                                                                                          \
        CUresult rc_ = (call);                                                                    \
        if (rc_ != CUDA_SUCCESS) {                                                                \
            fprintf(stderr, "%s:%d: %s = %d\n", __FILE__, __LINE__, #call, (int)rc_);             \
            exit(3);                                                                              \
        }                                                                                         \
    } while (0)

static void setup(int device)
{
    LOAD(lib, cuInit);
    LOAD(lib, cuDevicePrimaryCtxRetain);
    LOAD(lib, cuCtxSetCurrent);
    CHECK(p_cuInit(0));
    CUcontext ctx = NULL;
    CHECK(p_cuDevicePrimaryCtxRetain(&ctx, device));
    CHECK(p_cuCtxSetCurrent(ctx));
}

static void sleep_ms(long ms)
{
    struct timespec ts = {ms / 1000, (ms % 1000) * 1000000L};
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR)
        ;
}

enum { MAX_HELD = 4096 };

static int mode_grab(int argc, char **argv)
{
    if (argc < 5)
        return 2;
    setup(atoi(argv[2]));
    LOAD(lib, cuMemAlloc_v2);
    LOAD(lib, cuMemFree_v2);
    size_t chunk = strtoull(argv[3], NULL, 0);
    uint64_t end = test_now_ns() + (uint64_t)(atof(argv[4]) * 1e9);
    static CUdeviceptr held[MAX_HELD];
    int count = 0;
    long refused = 0;
    CUresult last = CUDA_SUCCESS;
    while (test_now_ns() < end && count < MAX_HELD) {
        last = p_cuMemAlloc_v2(&held[count], chunk);
        if (last == CUDA_SUCCESS) {
            count++;
            continue; /* take the next chunk at once */
        }
        refused++;
        sleep_ms(2);
    }
    printf("obtained=%llu allocations=%d refused=%ld last_rc=%d\n",
           (unsigned long long)count * chunk, count, refused, (int)last);
    for (int i = 0; i < count; i++)
        p_cuMemFree_v2(held[i]);
    return 0;
}

static int mode_neighbour(int argc, char **argv)
{
    if (argc < 5)
        return 2;
    setup(0);
    LOAD(lib, cuMemAlloc_v2);
    LOAD(lib, cuMemFree_v2);
    size_t bytes = strtoull(argv[2], NULL, 0);
    long hold_ms = atol(argv[3]), gap_ms = atol(argv[4]);
    unsigned long rounds = 0, failed = 0;
    for (;;) {
        CUdeviceptr p = 0;
        CUresult rc = p_cuMemAlloc_v2(&p, bytes);
        rounds++;
        if (rc != CUDA_SUCCESS)
            failed++;
        printf("rounds=%lu failed=%lu rc=%d\n", rounds, failed, (int)rc);
        sleep_ms(hold_ms);
        if (rc == CUDA_SUCCESS)
            p_cuMemFree_v2(p);
        sleep_ms(gap_ms);
    }
}

static int mode_limits(int argc, char **argv)
{
    if (argc < 6)
        return 2;
    FILE *f = fopen(argv[2], "w");
    if (f == NULL || fprintf(f, "tessera-limits 1\n%s memory=%s cores=%s\n", argv[3], argv[4],
                             argv[5]) < 0 || fclose(f) != 0) {
        perror(argv[2]);
        return 1;
    }
    if (chmod(argv[2], 0444) != 0) {
        perror(argv[2]);
        return 1;
    }
    printf("written=%s\n", argv[2]);
    return 0;
}

static int mode_region(int argc, char **argv)
{
    if (argc < 4)
        return 2;
    const char *how = argv[2], *path = argv[3];
    int fd = open(path, O_RDWR);
    struct stat st;
    if (fd < 0 || fstat(fd, &st) != 0) {
        perror(path);
        return 1;
    }
    int rc = 0;
    if (strcmp(how, "truncate") == 0) {
        rc = ftruncate(fd, 0);
    } else if (strcmp(how, "grow") == 0) {
        rc = ftruncate(fd, st.st_size + (64 << 20));
    } else if (strcmp(how, "scribble") == 0) {
        /* Not zeros: a pattern that makes every counter, count and state a large, wrong value. */
        static unsigned char junk[65536];
        for (size_t i = 0; i < sizeof junk; i++)
            junk[i] = (unsigned char)(0xA5 ^ (i * 131));
        for (off_t at = 0; at < st.st_size && rc == 0; at += (off_t)sizeof junk) {
            size_t n = (size_t)(st.st_size - at) < sizeof junk ? (size_t)(st.st_size - at)
                                                                  : sizeof junk;
            rc = pwrite(fd, junk, n, at) == (ssize_t)n ? 0 : -1;
        }
    } else if (strcmp(how, "zero") == 0) {
        static const uint64_t none[TESSERA_MAX_GPUS];
        for (int i = 0; i < TESSERA_REGION_SLOTS && rc == 0; i++) {
            off_t at = (off_t)(offsetof(struct tessera_region, slots) +
                               (size_t)i * sizeof(struct tessera_region_slot) +
                               offsetof(struct tessera_region_slot, used));
            rc = pwrite(fd, none, sizeof none, at) == (ssize_t)sizeof none ? 0 : -1;
        }
    } else {
        fprintf(stderr, "unknown region change %s\n", how);
        return 2;
    }
    if (rc != 0) {
        perror(path);
        return 1;
    }
    fstat(fd, &st);
    printf("region=%s size=%lld\n", how, (long long)st.st_size);
    return 0;
}

static int mode_rename(int argc, char **argv)
{
    if (argc < 4)
        return 2;
    if (rename(argv[2], argv[3]) == 0) {
        printf("renamed=0\n");
        return 0;
    }
    int e = errno;
    printf("renamed=1 errno=%s\n", e == EBUSY ? "EBUSY" : e == EXDEV ? "EXDEV" : e == EROFS ? "EROFS"
                                  : e == EACCES ? "EACCES" : e == EPERM ? "EPERM" : "other");
    return 1;
}

static int mode_link(int argc, char **argv)
{
    if (argc < 4)
        return 2;
    char folder[4096];
    snprintf(folder, sizeof folder, "%s", argv[2]);
    for (char *p = folder + 1; *p != '\0'; p++) {
        if (*p != '/')
            continue;
        *p = '\0';
        if (mkdir(folder, 0755) != 0 && errno != EEXIST) {
            perror(folder);
            return 1;
        }
        *p = '/';
    }
    if (symlink(argv[2], argv[3]) != 0) {
        perror(argv[3]);
        return 1;
    }
    printf("link=%s target=%s\n", argv[3], argv[2]);
    return 0;
}

int main(int argc, char **argv)
{
    setvbuf(stdout, NULL, _IOLBF, 0);
    if (argc < 2) {
        fprintf(stderr, "usage: see the comment at the top of tenant_attack.c\n");
        return 2;
    }
    const char *mode = argv[1];
    if (strcmp(mode, "limits") == 0)
        return mode_limits(argc, argv);
    if (strcmp(mode, "region") == 0)
        return mode_region(argc, argv);
    if (strcmp(mode, "link") == 0)
        return mode_link(argc, argv);
    if (strcmp(mode, "rename") == 0)
        return mode_rename(argc, argv);
    lib = test_open("TEST_LIBCUDA", "libcuda.so.1");
    if (strcmp(mode, "grab") == 0)
        return mode_grab(argc, argv);
    if (strcmp(mode, "neighbour") == 0)
        return mode_neighbour(argc, argv);
    fprintf(stderr, "unknown mode %s\n", mode);
    return 2;
}
