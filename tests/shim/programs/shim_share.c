/*
 * Memory shared between processes, and the patterns frameworks build on it. Runs unchanged on a
 * real GPU. Results are "key=value" lines; "used=" is the claim's usage as cuMemGetInfo_v2 shows
 * it on the process's device (through the shim: the claim's, all its processes).
 *
 *   shim_share ring N RANK BYTES DIR
 *       One rank of an NCCL-like ring set-up of N processes, one GPU each (device RANK modulo
 *       the devices it sees). Each rank allocates BYTES with cuMemAlloc and a VMM allocation
 *       exportable as a file descriptor, sends its right neighbour the IPC handle of the first
 *       and the descriptor of the second over a Unix socket in DIR, opens the left neighbour's
 *       (cuIpcOpenMemHandle; cuMemImportFromShareableHandle, cuMemMap, cuMemSetAccess), writes
 *       its rank into both, and checks that its own buffers hold its right neighbour's rank.
 *       Prints "opened used=", waits for a line on stdin, then closes the imports
 *       ("closed used=") and frees its own ("freed used=").
 *
 *   shim_share sleep CHUNKS CHUNK_BYTES CYCLES
 *       vLLM's sleep mode: CHUNKS VMM allocations mapped into one reserved range, written;
 *       CYCLES times "sleep" (save to host, unmap, release: used= drops) and "wake" (create and
 *       map again at the same addresses, restore, check). With "probe" lines: while asleep, an
 *       allocation of the whole slept size succeeds (asleep_alloc_rc=) and waking while it is
 *       held is refused (wake_while_held_rc=).
 *
 *   shim_share multigpu BYTES0 BYTES1
 *       One process, a context per device 0 and 1: peer access both ways (and the errors for
 *       enabling twice and disabling what is not enabled), how much each device lets it allocate
 *       in 1 MiB steps (max0=, max1=: each its own limit), cuMemGetInfo per device, and
 *       synchronous and asynchronous peer copies checked byte for byte.
 */
#include <errno.h>
#include <stdbool.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include "simgpu_test.h"

#define MiB (1ULL << 20)

static void *lib;

#define CHECK(call)                                                                               \
    do {                                                                                          \
        CUresult rc_ = (call);                                                                    \
        if (rc_ != CUDA_SUCCESS) {                                                                \
            fprintf(stderr, "%s:%d: %s = %d\n", __FILE__, __LINE__, #call, (int)rc_);             \
            exit(3);                                                                              \
        }                                                                                         \
    } while (0)

#define SYM(fn) ((__typeof__(&fn))test_sym(lib, #fn))

static CUcontext setup(int device)
{
    CHECK(SYM(cuInit)(0));
    int count = 0;
    CHECK(SYM(cuDeviceGetCount)(&count));
    CUcontext ctx = NULL;
    CHECK(SYM(cuDevicePrimaryCtxRetain)(&ctx, device % count));
    CHECK(SYM(cuCtxSetCurrent)(ctx));
    return ctx;
}

static unsigned long long used(void)
{
    size_t f = 0, t = 0;
    CHECK(SYM(cuMemGetInfo_v2)(&f, &t));
    return (unsigned long long)(t - f);
}

static size_t granularity(int device)
{
    CUmemAllocationProp prop = {.type = CU_MEM_ALLOCATION_TYPE_PINNED,
                                .requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR,
                                .location = {.type = CU_MEM_LOCATION_TYPE_DEVICE, .id = device}};
    size_t g = 0;
    CHECK(SYM(cuMemGetAllocationGranularity)(&g, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM));
    return g;
}

/* Create and map `size` bytes of VMM memory at `va` (reserved when 0), read-write. */
static CUresult vmm_map(int device, size_t size, CUdeviceptr *va,
                        CUmemGenericAllocationHandle *handle)
{
    CUmemAllocationProp prop = {.type = CU_MEM_ALLOCATION_TYPE_PINNED,
                                .requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR,
                                .location = {.type = CU_MEM_LOCATION_TYPE_DEVICE, .id = device}};
    CUresult rc = SYM(cuMemCreate)(handle, size, &prop, 0);
    if (rc != CUDA_SUCCESS)
        return rc;
    if (*va == 0)
        CHECK(SYM(cuMemAddressReserve)(va, size, 0, 0, 0));
    CHECK(SYM(cuMemMap)(*va, size, 0, *handle, 0));
    CUmemAccessDesc access = {.location = prop.location,
                              .flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE};
    CHECK(SYM(cuMemSetAccess)(*va, size, &access, 1));
    return CUDA_SUCCESS;
}

/* Map an imported handle of `size` bytes at a new reservation, read-write. */
static CUdeviceptr map_import(int device, CUmemGenericAllocationHandle handle, size_t size)
{
    CUdeviceptr va = 0;
    CHECK(SYM(cuMemAddressReserve)(&va, size, 0, 0, 0));
    CHECK(SYM(cuMemMap)(va, size, 0, handle, 0));
    CUmemAccessDesc access = {.location = {.type = CU_MEM_LOCATION_TYPE_DEVICE, .id = device},
                              .flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE};
    CHECK(SYM(cuMemSetAccess)(va, size, &access, 1));
    return va;
}

static bool holds(CUdeviceptr p, size_t bytes, uint32_t value)
{
    uint32_t words[256];
    size_t n = bytes / 4 < 256 ? bytes / 4 : 256;
    CHECK(SYM(cuMemcpyDtoH_v2)(words, p, n * 4));
    for (size_t i = 0; i < n; i++)
        if (words[i] != value)
            return false;
    return true;
}

/* ------------------------------------------------------------------ ring --------------- */

struct ring_msg {
    CUipcMemHandle ipc;
    uint64_t vmm_size;
    int32_t rank;
};

static void sock_path(struct sockaddr_un *a, const char *dir, int rank)
{
    memset(a, 0, sizeof *a);
    a->sun_family = AF_UNIX;
    snprintf(a->sun_path, sizeof a->sun_path, "%s/rank%d.sock", dir, rank);
}

static int send_msg(int fd, const struct ring_msg *m, int pass_fd)
{
    struct iovec iov = {.iov_base = (void *)m, .iov_len = sizeof *m};
    char ctrl[CMSG_SPACE(sizeof(int))];
    memset(ctrl, 0, sizeof ctrl);
    struct msghdr h = {.msg_iov = &iov, .msg_iovlen = 1, .msg_control = ctrl,
                       .msg_controllen = sizeof ctrl};
    struct cmsghdr *c = CMSG_FIRSTHDR(&h);
    c->cmsg_level = SOL_SOCKET;
    c->cmsg_type = SCM_RIGHTS;
    c->cmsg_len = CMSG_LEN(sizeof(int));
    memcpy(CMSG_DATA(c), &pass_fd, sizeof pass_fd);
    return sendmsg(fd, &h, 0) == (ssize_t)sizeof *m ? 0 : -1;
}

static int recv_msg(int fd, struct ring_msg *m, int *got_fd)
{
    struct iovec iov = {.iov_base = m, .iov_len = sizeof *m};
    char ctrl[CMSG_SPACE(sizeof(int))];
    struct msghdr h = {.msg_iov = &iov, .msg_iovlen = 1, .msg_control = ctrl,
                       .msg_controllen = sizeof ctrl};
    if (recvmsg(fd, &h, MSG_WAITALL) != (ssize_t)sizeof *m)
        return -1;
    struct cmsghdr *c = CMSG_FIRSTHDR(&h);
    if (c == NULL || c->cmsg_type != SCM_RIGHTS)
        return -1;
    memcpy(got_fd, CMSG_DATA(c), sizeof *got_fd);
    return 0;
}

static int ring(int n, int rank, size_t bytes, const char *dir)
{
    setup(rank);
    int dev = 0;
    CHECK(SYM(cuCtxGetDevice)(&dev));
    size_t vmm_size = granularity(dev);

    CUdeviceptr buf = 0, vmm = 0;
    CUmemGenericAllocationHandle handle = 0;
    CHECK(SYM(cuMemAlloc_v2)(&buf, bytes));
    CHECK(vmm_map(dev, vmm_size, &vmm, &handle));
    CHECK(SYM(cuMemsetD32_v2)(buf, 0, bytes / 4));
    CHECK(SYM(cuMemsetD32_v2)(vmm, 0, vmm_size / 4));
    struct ring_msg mine = {.vmm_size = vmm_size, .rank = rank};
    CHECK(SYM(cuIpcGetMemHandle)(&mine.ipc, buf));
    int exported = -1;
    CHECK(SYM(cuMemExportToShareableHandle)(&exported, handle,
                                            CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0));

    /* Listen for the left neighbour; connect to the right one (retrying while it starts). */
    struct sockaddr_un me, right;
    sock_path(&me, dir, rank);
    sock_path(&right, dir, (rank + 1) % n);
    int listener = socket(AF_UNIX, SOCK_STREAM, 0);
    if (listener < 0 || bind(listener, (struct sockaddr *)&me, sizeof me) != 0 ||
        listen(listener, 1) != 0) {
        perror("listen");
        return 4;
    }
    int out = socket(AF_UNIX, SOCK_STREAM, 0);
    int tries = 0;
    while (connect(out, (struct sockaddr *)&right, sizeof right) != 0) {
        if (++tries > 3000) {
            perror("connect");
            return 4;
        }
        usleep(10000);
    }
    int in = accept(listener, NULL, NULL);
    if (in < 0 || send_msg(out, &mine, exported) != 0) {
        perror("send");
        return 4;
    }
    struct ring_msg left;
    int imported_fd = -1;
    if (recv_msg(in, &left, &imported_fd) != 0 || left.rank != (rank + n - 1) % n) {
        fprintf(stderr, "bad message from the left neighbour\n");
        return 4;
    }
    close(exported);

    /* Open the left neighbour's memory and write our rank into it. */
    CUdeviceptr lbuf = 0;
    CHECK(SYM(cuIpcOpenMemHandle_v2)(&lbuf, left.ipc, CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS));
    CUmemGenericAllocationHandle limported = 0;
    CHECK(SYM(cuMemImportFromShareableHandle)(&limported, (void *)(intptr_t)imported_fd,
                                              CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR));
    close(imported_fd);
    CUdeviceptr lvmm = map_import(dev, limported, left.vmm_size);
    CHECK(SYM(cuMemsetD32_v2)(lbuf, (unsigned)rank + 1, bytes / 4));
    CHECK(SYM(cuMemsetD32_v2)(lvmm, (unsigned)rank + 1, left.vmm_size / 4));
    CHECK(SYM(cuCtxSynchronize)());
    char token = 'w';
    if (write(in, &token, 1) != 1 || read(out, &token, 1) != 1) { /* "wrote" to left, from right */
        perror("sync");
        return 4;
    }
    unsigned want = (unsigned)(rank + 1) % (unsigned)n + 1;
    printf("rank=%d device=%d ring_ok=%d\n", rank, dev,
           holds(buf, bytes, want) && holds(vmm, vmm_size, want));
    printf("opened used=%llu\n", used());
    fflush(stdout);

    char line[16];
    if (fgets(line, sizeof line, stdin) == NULL)
        line[0] = 0;
    CHECK(SYM(cuIpcCloseMemHandle)(lbuf));
    CHECK(SYM(cuMemUnmap)(lvmm, left.vmm_size));
    CHECK(SYM(cuMemRelease)(limported));
    CHECK(SYM(cuMemAddressFree)(lvmm, left.vmm_size));
    printf("closed used=%llu\n", used());
    fflush(stdout);
    /* Free our own only once the right neighbour has closed its imports of them. */
    if (write(in, &token, 1) != 1 || read(out, &token, 1) != 1) {
        perror("sync");
        return 4;
    }
    CHECK(SYM(cuMemFree_v2)(buf));
    CHECK(SYM(cuMemUnmap)(vmm, vmm_size));
    CHECK(SYM(cuMemRelease)(handle));
    printf("freed used=%llu\n", used());
    unlink(me.sun_path);
    return 0;
}

/* ------------------------------------------------------------------ sleep mode --------- */

static int sleep_mode(int chunks, size_t chunk, int cycles, bool probe)
{
    setup(0);
    if (chunks < 1 || chunks > 64)
        return 2;
    size_t g = granularity(0);
    chunk = (chunk + g - 1) / g * g;
    size_t total = chunk * (size_t)chunks;
    CUdeviceptr base = 0;
    CHECK(SYM(cuMemAddressReserve)(&base, total, 0, 0, 0));
    CUmemGenericAllocationHandle h[64];
    uint32_t *saved = malloc(total);
    if (saved == NULL)
        return 2;
    for (int i = 0; i < chunks; i++) {
        CUdeviceptr at = base + (size_t)i * chunk;
        CHECK(vmm_map(0, chunk, &at, &h[i]));
        CHECK(SYM(cuMemsetD32_v2)(at, 0xa0000000u + (unsigned)i, chunk / 4));
    }
    printf("awake used=%llu\n", used());
    int ok = 1;
    for (int c = 0; c < cycles; c++) {
        for (int i = 0; i < chunks; i++) /* offload */
            CHECK(SYM(cuMemcpyDtoH_v2)((char *)saved + (size_t)i * chunk,
                                       base + (size_t)i * chunk, chunk));
        for (int i = 0; i < chunks; i++) {
            CHECK(SYM(cuMemUnmap)(base + (size_t)i * chunk, chunk));
            CHECK(SYM(cuMemRelease)(h[i]));
        }
        unsigned long long asleep = used();
        if (c == 0)
            printf("asleep used=%llu\n", asleep);
        if (probe && c == 0) {
            CUdeviceptr other = 0;
            CUresult rc = SYM(cuMemAlloc_v2)(&other, total);
            printf("asleep_alloc_rc=%d\n", (int)rc);
            CUmemGenericAllocationHandle held = 0;
            CUdeviceptr at = base;
            CUresult wake = vmm_map(0, chunk, &at, &held);
            printf("wake_while_held_rc=%d\n", (int)wake);
            if (wake == CUDA_SUCCESS) {
                CHECK(SYM(cuMemUnmap)(base, chunk));
                CHECK(SYM(cuMemRelease)(held));
            }
            if (rc == CUDA_SUCCESS)
                CHECK(SYM(cuMemFree_v2)(other));
        }
        for (int i = 0; i < chunks; i++) { /* wake at the same addresses */
            CUdeviceptr at = base + (size_t)i * chunk;
            CUresult rc = vmm_map(0, chunk, &at, &h[i]);
            if (rc != CUDA_SUCCESS) {
                printf("wake_rc=%d cycle=%d chunk=%d\n", (int)rc, c, i);
                return 5;
            }
        }
        for (int i = 0; i < chunks; i++) /* reload */
            CHECK(SYM(cuMemcpyHtoD_v2)(base + (size_t)i * chunk,
                                       (char *)saved + (size_t)i * chunk, chunk));
        for (int i = 0; i < chunks; i++)
            ok &= holds(base + (size_t)i * chunk, chunk, 0xa0000000u + (unsigned)i);
    }
    printf("cycles=%d data_ok=%d woken used=%llu\n", cycles, ok, used());
    for (int i = 0; i < chunks; i++) {
        CHECK(SYM(cuMemUnmap)(base + (size_t)i * chunk, chunk));
        CHECK(SYM(cuMemRelease)(h[i]));
    }
    CHECK(SYM(cuMemAddressFree)(base, total));
    printf("end used=%llu\n", used());
    free(saved);
    return 0;
}

/* ------------------------------------------------------------------ multi-GPU ---------- */

/* Allocate 1 MiB at a time on the current context's device until refused (at most `cap`
 * bytes); free it all; how much was allocated and the refusal. */
static size_t fill(size_t cap, int *refusal)
{
    enum { MAX = 4096 };
    static CUdeviceptr got[MAX];
    int n = 0;
    *refusal = 0;
    while (n < MAX && (size_t)n * MiB < cap) {
        CUresult rc = SYM(cuMemAlloc_v2)(&got[n], MiB);
        if (rc != CUDA_SUCCESS) {
            *refusal = (int)rc;
            break;
        }
        n++;
    }
    for (int i = 0; i < n; i++)
        CHECK(SYM(cuMemFree_v2)(got[i]));
    return (size_t)n * MiB;
}

static int multigpu(size_t cap0, size_t cap1)
{
    CHECK(SYM(cuInit)(0));
    int count = 0;
    CHECK(SYM(cuDeviceGetCount)(&count));
    if (count < 2) {
        printf("devices=%d\n", count);
        return 6;
    }
    CUcontext ctx[2];
    for (int d = 0; d < 2; d++)
        CHECK(SYM(cuCtxCreate_v2)(&ctx[d], 0, d));
    int can01 = 0, can10 = 0;
    CHECK(SYM(cuDeviceCanAccessPeer)(&can01, 0, 1));
    CHECK(SYM(cuDeviceCanAccessPeer)(&can10, 1, 0));
    printf("can_access_peer=%d,%d\n", can01, can10);
    CHECK(SYM(cuCtxSetCurrent)(ctx[0]));
    CHECK(SYM(cuCtxEnablePeerAccess)(ctx[1], 0));
    printf("enable_twice_rc=%d\n", (int)SYM(cuCtxEnablePeerAccess)(ctx[1], 0));
    CHECK(SYM(cuCtxSetCurrent)(ctx[1]));
    printf("disable_unenabled_rc=%d\n", (int)SYM(cuCtxDisablePeerAccess)(ctx[0]));
    CHECK(SYM(cuCtxEnablePeerAccess)(ctx[0], 0));

    int refusal0 = 0, refusal1 = 0;
    CHECK(SYM(cuCtxSetCurrent)(ctx[0]));
    size_t max0 = fill(cap0, &refusal0);
    unsigned long long total0 = 0;
    {
        size_t f = 0, t = 0;
        CHECK(SYM(cuMemGetInfo_v2)(&f, &t));
        total0 = t;
    }
    CHECK(SYM(cuCtxSetCurrent)(ctx[1]));
    size_t max1 = fill(cap1, &refusal1);
    size_t f = 0, t = 0;
    CHECK(SYM(cuMemGetInfo_v2)(&f, &t));
    printf("max0=%zu refusal0=%d max1=%zu refusal1=%d total0=%llu total1=%zu\n", max0, refusal0,
           max1, refusal1, total0, t);

    /* Peer copies: device 0's buffer to device 1's and back, checked. */
    CUdeviceptr a = 0, b = 0;
    CHECK(SYM(cuCtxSetCurrent)(ctx[0]));
    CHECK(SYM(cuMemAlloc_v2)(&a, 4 * MiB));
    CHECK(SYM(cuMemsetD32_v2)(a, 0x5eed, MiB));
    CHECK(SYM(cuCtxSetCurrent)(ctx[1]));
    CHECK(SYM(cuMemAlloc_v2)(&b, 4 * MiB));
    CHECK(SYM(cuMemsetD32_v2)(b, 0, MiB));
    unsigned long long both = used(); /* device 1's view: its own 4 MiB only */
    CHECK(SYM(cuMemcpyPeer)(b, ctx[1], a, ctx[0], 4 * MiB));
    int sync_ok = holds(b, 4 * MiB, 0x5eed);
    CHECK(SYM(cuMemsetD32_v2)(b, 0xbeef, MiB));
    CUstream s = NULL;
    CHECK(SYM(cuStreamCreate)(&s, 0));
    CHECK(SYM(cuMemcpyPeerAsync)(a, ctx[0], b, ctx[1], 4 * MiB, s));
    CHECK(SYM(cuStreamSynchronize)(s));
    CHECK(SYM(cuCtxSetCurrent)(ctx[0]));
    int async_ok = holds(a, 4 * MiB, 0xbeef);
    unsigned long long used0 = used();
    printf("peer_copy_ok=%d peer_copy_async_ok=%d used0=%llu used1=%llu\n", sync_ok, async_ok,
           used0, both);
    CHECK(SYM(cuMemFree_v2)(a));
    CHECK(SYM(cuCtxSetCurrent)(ctx[1]));
    CHECK(SYM(cuMemFree_v2)(b));
    CHECK(SYM(cuCtxDisablePeerAccess)(ctx[0]));
    CHECK(SYM(cuCtxSetCurrent)(ctx[0]));
    CHECK(SYM(cuCtxDisablePeerAccess)(ctx[1]));
    for (int d = 0; d < 2; d++)
        CHECK(SYM(cuCtxDestroy_v2)(ctx[d]));
    return 0;
}

int main(int argc, char **argv)
{
    lib = test_open("TEST_LIBCUDA", "libcuda.so.1");
    if (argc == 6 && strcmp(argv[1], "ring") == 0)
        return ring(atoi(argv[2]), atoi(argv[3]), strtoull(argv[4], NULL, 0), argv[5]);
    if ((argc == 5 || argc == 6) && strcmp(argv[1], "sleep") == 0)
        return sleep_mode(atoi(argv[2]), strtoull(argv[3], NULL, 0), atoi(argv[4]),
                          argc == 6 && strcmp(argv[5], "probe") == 0);
    if (argc == 4 && strcmp(argv[1], "multigpu") == 0)
        return multigpu(strtoull(argv[2], NULL, 0), strtoull(argv[3], NULL, 0));
    fprintf(stderr, "usage: see the comment at the top of shim_share.c\n");
    return 2;
}
